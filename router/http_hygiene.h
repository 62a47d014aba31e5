// HTTP/1.1 request hygiene: what a parsed request head must satisfy before its body is read and the request
// is forwarded, and what is removed from it before it leaves for a worker.
//
// Boost.Beast 1.81's parser accepts framings that RFC 9112 tells a server to refuse (Beast rejects them only
// from 1.92 on): a Transfer-Encoding whose final coding is not chunked, chunked together with Content-Length,
// chunked in HTTP/1.0. A proxy that frames such a request one way while the next hop frames it another is
// open to request smuggling (the body of one request is read as the next). So kvroute checks the head
// itself, answers with the returned Error and closes the connection: after a bad framing nothing that
// follows on the connection can be trusted.
//
// Contract:
//   - check_request_head() looks at the head only (call it once the parser reports is_header_done(), before
//     the body is read). nullopt: acceptable. Otherwise an Error with the status to answer (400, 431 or 501);
//     the caller must close the connection after answering.
//   - normalize_target() applies RFC 3986 section 5.2.4 (remove_dot_segments) to the path of an origin-form
//     target, percent-encoded dots included; a path that climbs above the root is an Error (400).
//   - HopByHopFilter / strip_hop_by_hop() find and remove the hop-by-hop fields of RFC 9110 section 7.6.1
//     and every field the Connection header names, so none of them reaches the worker.
//
//   if (parser.is_header_done()) {
//     if (auto bad = check_request_head(parser.get().base(), limits)) { answer(*bad); close(); }
//   }
//   auto path = normalize_target(req.target());   // "/v1/../admin/workers" -> "/admin/workers"
//   strip_hop_by_hop(upstream_req.base());
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/beast/http/fields.hpp>
#include <boost/beast/http/message.hpp>

#include "util/result.h"

namespace kvroute::router {

struct HygieneLimits {
  // Envoy's default max_headers_count is 100; a request of an OpenAI client carries about a dozen.
  std::size_t max_header_fields = 100;
};

// The first rule of RFC 9112 sections 3.2, 6.1 and 6.3 the head breaks, or nullopt.
std::optional<Error> check_request_head(const boost::beast::http::request_header<>& head,
                                        const HygieneLimits& limits = {});

// The target with its dot segments removed (the query is kept as sent). Errors: not origin-form (does not
// start with '/'), or a ".." that would leave the root.
Result<std::string> normalize_target(std::string_view target);

// Which fields of a message are hop-by-hop: those of RFC 9110 section 7.6.1's list (Connection,
// Proxy-Connection, Keep-Alive, TE, Transfer-Encoding, Upgrade; Trailer, Proxy-Authenticate and
// Proxy-Authorization from RFC 9110's predecessors) and every field a Connection header of the message names.
// Built once per message (it keeps views into the message's Connection values, so the message must outlive
// it and keep its Connection fields), then asked per field while copying:
//   HopByHopFilter hop(req.base());
//   for (const auto& f : req) if (!hop(f.name_string())) upstream.insert(f.name_string(), f.value());
class HopByHopFilter {
 public:
  explicit HopByHopFilter(const boost::beast::http::fields& message);
  bool operator()(std::string_view name) const;

 private:
  std::vector<std::string_view> named_;  // the Connection header's tokens
};

// Removes every hop-by-hop field (above) from `message`. The framing fields go too: the caller re-frames the
// forwarded body (Beast's prepare_payload()).
void strip_hop_by_hop(boost::beast::http::fields& message);

}  // namespace kvroute::router
