// HTTP helpers shared by the API session, the upstream exchange and the admin session: limits, error and JSON
// answers, request ids, and the pieces a relayed message is written from.
//
//   auto res = json_response(200, R"({"status":"ok"})");
//   set_common_headers(*res, request_id);  // Server, x-request-id
//   if (auto e = read_failure(ec, max_body)) answer(error_response(*e)); else close();
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <boost/asio/buffer.hpp>
#include <boost/beast/http/field.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>

#include "util/result.h"

namespace kvroute::router {

namespace http = boost::beast::http;
using StringResponse = http::response<http::string_body>;
using StringRequest = http::request<http::string_body>;

inline constexpr std::size_t kHeaderLimit = 64 * 1024;  // bytes of a request's or a worker response's head

std::chrono::steady_clock::duration seconds(double s);
std::string fmt_seconds(double s);  // "2.5 s"

// The request's own x-request-id when it has a usable one (at most 200 bytes), else a new random id.
std::string request_id_of(const StringRequest& req);

// Fields that describe one hop, not the message: never relayed (RFC 9110 section 7.6.1), plus those the relay
// sets itself (length, Host, Expect).
bool hop_by_hop(http::field f, std::string_view name);

// Appends one "name: value" header line.
void append_field(std::string& head, std::string_view name, std::string_view value);

// The buffers of one relayed write, at most five: head, chunk-size line, data, CRLF, last chunk. The relay
// builds each message head as one string instead of letting Beast's serializer hand the socket every
// start-line part and header field as a separate buffer: iterating those was the largest user-space cost of
// a relayed request (docs/overhead.md).
struct Pieces {
  using value_type = boost::asio::const_buffer;
  using const_iterator = const boost::asio::const_buffer*;
  std::array<boost::asio::const_buffer, 5> b;
  std::size_t n = 0;
  void add(const void* data, std::size_t size) {
    if (size > 0) b[n++] = boost::asio::const_buffer(data, size);
  }
  const_iterator begin() const { return b.data(); }
  const_iterator end() const { return b.data() + n; }
};

std::shared_ptr<StringResponse> json_response(unsigned status, std::string body);
// An OpenAI-style error body with the error's status (and Retry-After on a 429 and on no_healthy_worker's 503).
std::shared_ptr<StringResponse> error_response(const Error& e);
void set_common_headers(StringResponse& res, const std::string& request_id);  // Server, x-request-id
// Readies an answer to be written: the common headers, keep-alive or close, the length.
void prepare_answer(StringResponse& res, const std::string& request_id, bool keep_alive);

Error method_not_allowed(std::string_view method, const char* allowed);
Error no_route(std::string_view method, std::string_view path);
Error no_healthy_worker();

// A request that could not be read: nullopt when the connection just ends (closed, reset, timed out), else
// the error to answer before closing (body or head too large, malformed HTTP).
std::optional<Error> read_failure(boost::system::error_code ec, std::uint64_t max_body_bytes);

// The path of a request target, without its query.
inline std::string_view target_path(std::string_view target) { return target.substr(0, target.find('?')); }

}  // namespace kvroute::router
