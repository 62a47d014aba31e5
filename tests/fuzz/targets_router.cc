#include "tests/fuzz/targets.h"

#include <array>
#include <string>
#include <string_view>

#include <boost/asio/buffer.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/json.hpp>

#include "hashing/chat_canonical.h"
#include "router/config.h"
#include "router/http_hygiene.h"
#include "router/request.h"
#include "router/usage.h"

namespace kvroute::fuzz {

namespace {

std::string_view text(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// A client's request body. The first byte picks the endpoint and options; the rest is the body.
void run_request(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return;
  const std::uint8_t sel = data[0];
  const std::string_view body = text(data + 1, size - 1);
  const router::Endpoint endpoints[] = {router::Endpoint::kChatCompletions, router::Endpoint::kCompletions,
                                        router::Endpoint::kResponses};
  router::ParseOptions opt;
  opt.tokenize = (sel & 4) != 0;
  router::SaltOptions salt;
  salt.allow_client_cache_salt = (sel & 8) != 0;
  salt.secret = "fuzz";
  const router::RequestHeaders headers{.session = "", .tenant = (sel & 16) ? "tenant" : "", .priority = ""};
  auto r = router::parse_request(endpoints[sel % 3], body, headers, opt, salt);
  if (r && !r->upstream_body.empty()) {
    // What is forwarded must still be a JSON object with the same model.
    boost::system::error_code ec;
    const auto doc = boost::json::parse(r->upstream_body, ec);
    if (ec || !doc.is_object()) __builtin_trap();
  }
  (void)router::top_level_model(body);
  (void)router::response_id(body, (sel & 32) != 0);
  (void)router::responses_output_began(body);
  // Chat canonicalization on its own: a messages array, or a Responses API request object.
  boost::system::error_code ec;
  const auto doc = boost::json::parse(body, ec);
  if (ec) return;
  if (doc.is_array()) (void)hashing::canonical_chat(doc, nullptr);
  if (const auto* obj = doc.if_object()) {
    (void)hashing::responses_messages(*obj);
    std::string out;
    hashing::canonical_json(doc, out);
  }
}

// A worker's response bytes: the usage readers and the Responses API status reader (fed in two pieces).
void run_usage(const std::uint8_t* data, std::size_t size) {
  const std::string_view all = text(data, size);
  (void)router::find_usage(all);
  (void)router::usage_only_chunk(all);
  (void)router::final_response_status(all);
  router::ResponseStatusReader reader;
  const std::size_t cut = size == 0 ? 0 : data[0] % (size + 1);
  reader.feed(all.substr(0, cut));
  reader.feed(all.substr(cut));
  (void)reader.finish();
}

void run_config(const std::uint8_t* data, std::size_t size) {
  (void)router::apply_yaml(router::Config{}, std::string(text(data, size)), "fuzz.yaml");
}

// Raw bytes from a client socket: Beast parses the head as the server does, then the hygiene rules judge it.
void run_hygiene(const std::uint8_t* data, std::size_t size) {
  namespace http = boost::beast::http;
  http::request_parser<http::empty_body> parser;
  parser.header_limit(64 * 1024);
  boost::beast::error_code ec;
  std::size_t used = 0;
  while (used < size && !parser.is_header_done()) {
    const std::size_t n = parser.put(boost::asio::buffer(data + used, size - used), ec);
    used += n;
    if (ec || n == 0) break;
  }
  if (!parser.is_header_done()) return;
  auto& req = parser.get();
  (void)router::check_request_head(req.base());
  const auto target = req.target();
  (void)router::normalize_target(std::string_view(target.data(), target.size()));
  router::strip_hop_by_hop(req.base());
  const router::HopByHopFilter hop(req.base());
  for (const auto& f : req) {
    if (hop(std::string_view(f.name_string().data(), f.name_string().size()))) {
      __builtin_trap();  // stripping left a hop-by-hop field
    }
  }
}

constexpr std::array<FuzzTarget, 4> kTargets = {{
    {"request", run_request},
    {"usage", run_usage},
    {"config", run_config},
    {"hygiene", run_hygiene},
}};

}  // namespace

std::span<const FuzzTarget> router_fuzz_targets() { return kTargets; }

}  // namespace kvroute::fuzz
