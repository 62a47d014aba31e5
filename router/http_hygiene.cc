#include "router/http_hygiene.h"

#include <array>
#include <span>
#include <vector>

#include <boost/beast/core/string.hpp>

namespace kvroute::router {

namespace http = boost::beast::http;
using boost::beast::iequals;

namespace {

Error bad_request(std::string message) {
  return make_error(std::move(message), 400, "invalid_request_error", "bad_http");
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// The elements of a comma-separated list field over all its lines (RFC 9110 section 5.6.1: empty elements
// are ignored). A coding's parameters (";q=...") are cut off.
std::vector<std::string_view> list_elements(const http::fields& f, http::field name) {
  std::vector<std::string_view> out;
  for (auto [it, end] = f.equal_range(name); it != end; ++it) {
    std::string_view v(it->value().data(), it->value().size());
    while (!v.empty()) {
      const std::size_t comma = v.find(',');
      std::string_view item = v.substr(0, comma);
      v = comma == std::string_view::npos ? std::string_view{} : v.substr(comma + 1);
      if (const std::size_t semi = item.find(';'); semi != std::string_view::npos) item = item.substr(0, semi);
      item = trim(item);
      if (!item.empty()) out.push_back(item);
    }
  }
  return out;
}

// RFC 9112 section 6.1: chunked must be the final coding, applied once; kvroute decodes no other coding.
std::optional<Error> check_transfer_encoding(const http::request_header<>& head) {
  if (head.version() < 11) {
    // "A server ... that receives an HTTP/1.0 message containing a Transfer-Encoding header field MUST treat
    // the message as if the framing is faulty" (section 6.1).
    return bad_request("Transfer-Encoding is not allowed in an HTTP/1.0 request");
  }
  if (head.count(http::field::content_length) > 0) {
    return bad_request("a request must not carry both Transfer-Encoding and Content-Length");
  }
  const auto codings = list_elements(head, http::field::transfer_encoding);
  if (codings.empty()) return bad_request("Transfer-Encoding is empty");
  if (!iequals(codings.back(), "chunked")) {
    return bad_request("the final transfer coding must be chunked, not '" + std::string(codings.back()) + "'");
  }
  const auto inner = std::span(codings).first(codings.size() - 1);
  for (std::string_view c : inner) {
    if (iequals(c, "chunked")) return bad_request("chunked is applied more than once");
  }
  if (!inner.empty()) {
    // Section 6.1: a coding the server does not understand is answered 501.
    return make_error("transfer coding '" + std::string(inner.front()) + "' is not supported", 501,
                      "invalid_request_error", "bad_http");
  }
  return std::nullopt;
}

// RFC 9112 section 6.3 item 5: several Content-Length values that differ make the length unknowable.
std::optional<Error> check_content_length(const http::request_header<>& head) {
  const auto values = list_elements(head, http::field::content_length);
  for (std::string_view v : values) {
    if (v.size() > 19 || v.find_first_not_of("0123456789") != std::string_view::npos) {
      return bad_request("Content-Length '" + std::string(v) + "' is not a number");
    }
    if (v != values.front()) return bad_request("conflicting Content-Length values");
  }
  return std::nullopt;
}

}  // namespace

std::optional<Error> check_request_head(const http::request_header<>& head, const HygieneLimits& limits) {
  std::size_t fields = 0;
  for (auto it = head.begin(); it != head.end(); ++it) ++fields;
  if (fields > limits.max_header_fields) {
    // RFC 6585 section 5.
    return make_error("request has " + std::to_string(fields) + " header fields; the limit is " +
                          std::to_string(limits.max_header_fields),
                      431, "invalid_request_error", "headers_too_large");
  }
  // RFC 9112 section 3.2: a 400 for an HTTP/1.1 request without Host, and for any request with more than one.
  const std::size_t hosts = head.count(http::field::host);
  if (hosts > 1) return bad_request("a request must carry one Host header, not " + std::to_string(hosts));
  if (hosts == 0 && head.version() >= 11) return bad_request("an HTTP/1.1 request must carry a Host header");
  if (hosts == 1) {
    const auto host = head[http::field::host];
    if (host.find_first_of(" \t,/@") != boost::beast::string_view::npos) {
      return bad_request("Host header is not a valid authority");
    }
  }
  if (head.count(http::field::transfer_encoding) > 0) return check_transfer_encoding(head);
  return check_content_length(head);
}

namespace {

// A path segment that is "." or ".." once percent-encoded dots (%2e, %2E) are read as dots.
int dot_segment(std::string_view seg) {
  int dots = 0;
  for (std::size_t i = 0; i < seg.size();) {
    if (seg[i] == '.') {
      ++i;
    } else if (seg.size() - i >= 3 && seg[i] == '%' && seg[i + 1] == '2' && (seg[i + 2] == 'e' || seg[i + 2] == 'E')) {
      i += 3;
    } else {
      return 0;
    }
    if (++dots > 2) return 0;
  }
  return dots;
}

}  // namespace

Result<std::string> normalize_target(std::string_view target) {
  if (target.empty() || target.front() != '/') return bad_request("request target must be a path starting with '/'");
  const std::size_t q = target.find('?');
  const std::string_view path = target.substr(0, q);
  const std::string_view query = q == std::string_view::npos ? std::string_view{} : target.substr(q);
  std::vector<std::string_view> kept;
  bool trailing_slash = false;
  std::string_view rest = path.substr(1);
  for (;;) {
    const std::size_t slash = rest.find('/');
    const std::string_view seg = rest.substr(0, slash);
    const int dots = dot_segment(seg);
    trailing_slash = dots > 0;
    if (dots == 2) {
      if (kept.empty()) return bad_request("request path climbs above the root: '" + std::string(path) + "'");
      kept.pop_back();
    } else if (dots == 0) {
      kept.push_back(seg);
    }
    if (slash == std::string_view::npos) break;
    rest = rest.substr(slash + 1);
  }
  std::string out;
  out.reserve(target.size());
  for (std::string_view seg : kept) out.append(1, '/').append(seg);
  if (trailing_slash || out.empty()) out.push_back('/');
  out.append(query);
  return out;
}

HopByHopFilter::HopByHopFilter(const http::fields& message)
    : named_(list_elements(message, http::field::connection)) {}

bool HopByHopFilter::operator()(std::string_view name) const {
  static constexpr std::array<std::string_view, 9> kHopByHop = {
      "connection", "proxy-connection", "keep-alive", "te", "transfer-encoding",
      "upgrade",    "trailer",          "proxy-authenticate", "proxy-authorization"};
  for (std::string_view h : kHopByHop) {
    if (iequals(name, h)) return true;
  }
  for (std::string_view token : named_) {
    if (iequals(name, token)) return true;
  }
  return false;
}

void strip_hop_by_hop(http::fields& message) {
  std::vector<std::string> doomed;
  {
    const HopByHopFilter hop(message);
    for (const auto& f : message) {
      const std::string_view name(f.name_string().data(), f.name_string().size());
      if (hop(name)) doomed.emplace_back(name);
    }
  }
  for (const std::string& name : doomed) message.erase(name);
}

}  // namespace kvroute::router
