#include "router/http_util.h"

#include <cstdio>
#include <random>

#include <boost/asio/error.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/error.hpp>

#include "router/request.h"

namespace kvroute::router {

namespace beast = boost::beast;
namespace asio = boost::asio;

std::chrono::steady_clock::duration seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}

std::string fmt_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", s);
  return buf;
}

namespace {
std::string new_request_id() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id(32, '0');
  for (int half = 0; half < 2; ++half) {
    std::uint64_t x = rng();
    for (int i = 0; i < 16; ++i, x >>= 4) id[half * 16 + i] = kHex[x & 15];
  }
  return id;
}
}  // namespace

std::string request_id_of(const StringRequest& req) {
  std::string id(req["x-request-id"]);
  if (id.empty() || id.size() > 200) id = new_request_id();
  return id;
}

bool hop_by_hop(http::field f, std::string_view name) {
  switch (f) {
    case http::field::connection:
    case http::field::keep_alive:
    case http::field::proxy_authenticate:
    case http::field::proxy_authorization:
    case http::field::te:
    case http::field::trailer:
    case http::field::transfer_encoding:
    case http::field::upgrade:
    case http::field::content_length:
    case http::field::host:
    case http::field::expect:  // the router answers it itself, and forwards requests whole
      return true;
    default:
      return beast::iequals(name, "proxy-connection");
  }
}

void append_field(std::string& head, std::string_view name, std::string_view value) {
  head.append(name);
  head.append(": ");
  head.append(value);
  head.append("\r\n");
}

std::shared_ptr<StringResponse> json_response(unsigned status, std::string body) {
  auto res = std::make_shared<StringResponse>(static_cast<http::status>(status), 11);
  res->set(http::field::content_type, "application/json");
  res->body() = std::move(body);
  return res;
}

std::shared_ptr<StringResponse> error_response(const Error& e) {
  auto res = json_response(e.status, error_json(e));
  // A sheddable request refused while the fleet is saturated: it can come back in a moment.
  if (e.status == 429 || e.code == "no_healthy_worker") res->set(http::field::retry_after, "1");
  return res;
}

void set_common_headers(StringResponse& res, const std::string& request_id) {
  res.set(http::field::server, "kvroute");
  if (!request_id.empty()) res.set("x-request-id", request_id);
}

void prepare_answer(StringResponse& res, const std::string& request_id, bool keep_alive) {
  set_common_headers(res, request_id);
  res.keep_alive(keep_alive);
  res.prepare_payload();
}

Error method_not_allowed(std::string_view method, const char* allowed) {
  return make_error("method " + std::string(method) + " is not allowed here (use " + allowed + ")", 405,
                    "invalid_request_error", "method_not_allowed");
}

Error no_route(std::string_view method, std::string_view path) {
  return make_error("no route for " + std::string(method) + " " + std::string(path), 404, "invalid_request_error",
                    "unknown_route");
}

Error no_healthy_worker() {
  return make_error("no healthy worker is available", 503, "service_unavailable", "no_healthy_worker");
}

std::optional<Error> read_failure(boost::system::error_code ec, std::uint64_t max_body_bytes) {
  if (ec == http::error::end_of_stream || ec == asio::error::operation_aborted || ec == beast::error::timeout ||
      ec == asio::error::connection_reset || ec == asio::error::eof) {
    return std::nullopt;
  }
  if (ec == http::error::body_limit) {
    return make_error("request body exceeds the limit of " + std::to_string(max_body_bytes) + " bytes", 413,
                      "invalid_request_error", "body_too_large");
  }
  if (ec == http::error::header_limit) {
    return make_error("request headers exceed 65536 bytes", 431, "invalid_request_error", "headers_too_large");
  }
  return make_error("malformed HTTP request: " + ec.message(), 400, "invalid_request_error", "bad_http");
}

}  // namespace kvroute::router
