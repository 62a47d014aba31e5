// End-to-end tests of kvroute-sim's HTTP surface: the real binary on loopback, driven over HTTP.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <boost/json/value.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string_view>
#include <thread>

#include "tests/sim_server/sim_process.h"

namespace kvroute::sim::testing {
namespace {

namespace json = boost::json;

json::value parse(const std::string& s) {
  boost::system::error_code ec;
  json::value v = json::parse(s, ec);
  EXPECT_FALSE(ec) << "not JSON: " << s;
  return v;
}

std::int64_t cached_tokens(const json::value& body) {
  return body.at("usage").at("prompt_tokens_details").at("cached_tokens").as_int64();
}

// ~400 tokens of English-like text; a distinct `tag` gives a distinct prefix.
std::string long_prompt(const std::string& tag) {
  std::string s = "Document " + tag + ".";
  for (int i = 0; i < 40; ++i) s += " The router sends each request to the worker that holds its prefix in cache.";
  return s;
}

void expect_openai_error(const HttpReply& r, int status) {
  EXPECT_EQ(r.status, status) << r.body;
  json::value v = parse(r.body);
  ASSERT_TRUE(v.is_object()) << r.body;
  const auto* err = v.as_object().if_contains("error");
  ASSERT_NE(err, nullptr) << r.body;
  EXPECT_TRUE(err->at("message").is_string());
  EXPECT_TRUE(err->at("type").is_string());
  EXPECT_TRUE(err->as_object().contains("code"));
}

class SimServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    sim_ = new SimProcess({"--speed", "200", "--served-model-name", "sim-model", "--num-gpu-blocks", "4096",
                           "--max-body-bytes", "65536"});
  }
  static void TearDownTestSuite() {
    delete sim_;
    sim_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(sim_->ready()) << "kvroute-sim did not start"; }
  static std::uint16_t port() { return sim_->port(); }
  static SimProcess* sim_;
};
SimProcess* SimServerTest::sim_ = nullptr;

TEST_F(SimServerTest, HealthAndModels) {
  EXPECT_EQ(http_call(port(), "GET", "/health").status, 200);
  HttpReply r = http_call(port(), "GET", "/v1/models");
  ASSERT_EQ(r.status, 200);
  json::value v = parse(r.body);
  EXPECT_EQ(v.at("object").as_string(), "list");
  EXPECT_EQ(v.at("data").at(0).at("id").as_string(), "sim-model");
  EXPECT_GT(v.at("data").at(0).at("max_model_len").as_int64(), 0);
}

TEST_F(SimServerTest, CompletionNonStreamingIsDeterministic) {
  const std::string body = R"({"model":"sim-model","prompt":"Tell me about prefix caching.","max_tokens":7})";
  HttpReply a = http_call(port(), "POST", "/v1/completions", body);
  ASSERT_EQ(a.status, 200) << a.body;
  EXPECT_NE(a.content_type.find("application/json"), std::string::npos);
  json::value v = parse(a.body);
  EXPECT_EQ(v.at("object").as_string(), "text_completion");
  EXPECT_EQ(v.at("model").as_string(), "sim-model");
  const auto& choice = v.at("choices").at(0);
  EXPECT_FALSE(choice.at("text").as_string().empty());
  EXPECT_EQ(choice.at("finish_reason").as_string(), "length");
  EXPECT_EQ(v.at("usage").at("completion_tokens").as_int64(), 7);
  EXPECT_GT(v.at("usage").at("prompt_tokens").as_int64(), 0);
  EXPECT_EQ(v.at("usage").at("total_tokens").as_int64(),
            v.at("usage").at("prompt_tokens").as_int64() + 7);
  EXPECT_GE(cached_tokens(v), 0);  // always present

  HttpReply b = http_call(port(), "POST", "/v1/completions", body);
  ASSERT_EQ(b.status, 200);
  EXPECT_EQ(parse(b.body).at("choices").at(0).at("text"), choice.at("text"));
}

TEST_F(SimServerTest, ChatNonStreaming) {
  HttpReply r = http_call(port(), "POST", "/v1/chat/completions",
                          R"({"messages":[{"role":"system","content":"Be brief."},)"
                          R"({"role":"user","content":[{"type":"text","text":"Hi there"}]}],)"
                          R"("max_completion_tokens":5,"ignore_eos":true})");
  ASSERT_EQ(r.status, 200) << r.body;
  json::value v = parse(r.body);
  EXPECT_EQ(v.at("object").as_string(), "chat.completion");
  EXPECT_EQ(v.at("choices").at(0).at("message").at("role").as_string(), "assistant");
  EXPECT_FALSE(v.at("choices").at(0).at("message").at("content").as_string().empty());
  EXPECT_EQ(v.at("usage").at("completion_tokens").as_int64(), 5);
  EXPECT_GE(cached_tokens(v), 0);
}

TEST_F(SimServerTest, StreamingCompletionWithUsageMatchesNonStreaming) {
  const std::string prompt = R"("prompt":"Streaming should give the same words.","max_tokens":6)";
  HttpReply full = http_call(port(), "POST", "/v1/completions", "{" + prompt + "}");
  ASSERT_EQ(full.status, 200);
  HttpReply r = http_call(port(), "POST", "/v1/completions",
                          "{" + prompt + R"(,"stream":true,"stream_options":{"include_usage":true}})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_NE(r.content_type.find("text/event-stream"), std::string::npos);
  auto events = sse_data(r.body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  json::value usage_chunk = parse(events[events.size() - 2]);
  EXPECT_TRUE(usage_chunk.at("choices").as_array().empty());
  EXPECT_EQ(usage_chunk.at("usage").at("completion_tokens").as_int64(), 6);
  EXPECT_GE(cached_tokens(usage_chunk), 0);
  std::string text;
  bool finished = false;
  for (std::size_t i = 0; i + 2 < events.size(); ++i) {
    json::value c = parse(events[i]);
    EXPECT_EQ(c.at("object").as_string(), "text_completion");
    const auto& ch = c.at("choices").at(0);
    text += std::string(ch.at("text").as_string());
    if (ch.at("finish_reason").is_string()) finished = true;
  }
  EXPECT_TRUE(finished);
  EXPECT_EQ(text, parse(full.body).at("choices").at(0).at("text").as_string());
}

TEST_F(SimServerTest, StreamingChatWithoutUsage) {
  HttpReply r = http_call(port(), "POST", "/v1/chat/completions",
                          R"({"messages":[{"role":"user","content":"Count to three."}],"max_tokens":3,"stream":true})");
  ASSERT_EQ(r.status, 200) << r.body;
  auto events = sse_data(r.body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  json::value first = parse(events.front());
  EXPECT_EQ(first.at("object").as_string(), "chat.completion.chunk");
  EXPECT_EQ(first.at("choices").at(0).at("delta").at("role").as_string(), "assistant");
  int content_chunks = 0;
  for (std::size_t i = 0; i + 1 < events.size(); ++i) {
    json::value c = parse(events[i]);
    EXPECT_FALSE(c.as_object().contains("usage")) << events[i];
    ASSERT_FALSE(c.at("choices").as_array().empty());
    const auto* content = c.at("choices").at(0).at("delta").as_object().if_contains("content");
    if (content && !content->as_string().empty()) ++content_chunks;
  }
  EXPECT_EQ(content_chunks, 3);
}

TEST_F(SimServerTest, CachedTokensGrowWhenPrefixIsResent) {
  const std::string body = json::serialize(json::object{{"prompt", long_prompt("cache-growth")}, {"max_tokens", 2}});
  HttpReply a = http_call(port(), "POST", "/v1/completions", body);
  ASSERT_EQ(a.status, 200) << a.body;
  json::value va = parse(a.body);
  const std::int64_t prompt_tokens = va.at("usage").at("prompt_tokens").as_int64();
  EXPECT_GT(prompt_tokens, 300);
  EXPECT_EQ(cached_tokens(va), 0);  // a fresh prefix
  HttpReply b = http_call(port(), "POST", "/v1/completions", body);
  json::value vb = parse(b.body);
  EXPECT_GE(cached_tokens(vb), (prompt_tokens - 1) / 16 * 16 - 16);
  EXPECT_LT(cached_tokens(vb), prompt_tokens);
}

TEST_F(SimServerTest, ChatTurnsShareTheirPrefix) {
  json::array messages = {json::object{{"role", "user"}, {"content", long_prompt("chat-turns")}}};
  HttpReply t1 = http_call(port(), "POST", "/v1/chat/completions",
                           json::serialize(json::object{{"messages", messages}, {"max_tokens", 20}}));
  ASSERT_EQ(t1.status, 200) << t1.body;
  json::value v1 = parse(t1.body);
  const std::int64_t p1 = v1.at("usage").at("prompt_tokens").as_int64();
  messages.push_back(json::object{{"role", "assistant"}, {"content", v1.at("choices").at(0).at("message").at("content")}});
  messages.push_back(json::object{{"role", "user"}, {"content", "And then?"}});
  const std::string body2 = json::serialize(json::object{{"messages", messages}, {"max_tokens", 4}});
  // The tokens of turn 1 (prompt + output) are a prefix of turn 2's prompt.
  json::array first_turn;
  first_turn.push_back(messages[0]);
  json::object tok1_body;
  tok1_body["messages"] = first_turn;
  HttpReply tok1 = http_call(port(), "POST", "/tokenize", json::serialize(tok1_body));
  HttpReply tok2 = http_call(port(), "POST", "/tokenize", json::serialize(json::object{{"messages", messages}}));
  const json::value j1 = parse(tok1.body);
  const json::value j2 = parse(tok2.body);
  const auto& a1 = j1.at("tokens").as_array();
  const auto& a2 = j2.at("tokens").as_array();
  ASSERT_EQ(static_cast<std::int64_t>(a1.size()), p1);
  ASSERT_GT(a2.size(), a1.size() + 20);
  for (std::size_t i = 0; i < a1.size(); ++i) ASSERT_EQ(a1[i], a2[i]) << "token " << i;
  HttpReply t2 = http_call(port(), "POST", "/v1/chat/completions", body2);
  ASSERT_EQ(t2.status, 200) << t2.body;
  // Prompt and generated blocks of turn 1 are cached: at least every full block of turn 1's prompt.
  EXPECT_GE(cached_tokens(parse(t2.body)), p1 / 16 * 16);
}

TEST_F(SimServerTest, Tokenize) {
  HttpReply r = http_call(port(), "POST", "/tokenize", R"({"model":"sim-model","prompt":"Hello, world!"})");
  ASSERT_EQ(r.status, 200) << r.body;
  json::value v = parse(r.body);
  EXPECT_EQ(v.at("count").as_int64(), 4);
  EXPECT_EQ(v.at("tokens").as_array().size(), 4u);
  EXPECT_GT(v.at("max_model_len").as_int64(), 0);
  EXPECT_EQ(http_call(port(), "POST", "/tokenize", R"({"prompt":"Hello, world!"})").body, r.body);
  HttpReply chat = http_call(port(), "POST", "/tokenize", R"({"messages":[{"role":"user","content":"Hello"}]})");
  ASSERT_EQ(chat.status, 200);
  EXPECT_GT(parse(chat.body).at("count").as_int64(), 3);
  // About 4 bytes per token on English prose.
  const std::string prose = long_prompt("ratio");
  HttpReply p = http_call(port(), "POST", "/tokenize", json::serialize(json::object{{"prompt", prose}}));
  const double bytes_per_token = static_cast<double>(prose.size()) / parse(p.body).at("count").as_int64();
  EXPECT_GT(bytes_per_token, 3.0);
  EXPECT_LT(bytes_per_token, 5.5);
}

TEST_F(SimServerTest, TokenIdPrompts) {
  std::string ids = "[";
  for (int i = 0; i < 40; ++i) ids += (i ? "," : "") + std::to_string(5000 + i);
  ids += "]";
  HttpReply r = http_call(port(), "POST", "/v1/completions", R"({"prompt":)" + ids + R"(,"max_tokens":2})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(parse(r.body).at("usage").at("prompt_tokens").as_int64(), 40);
  HttpReply nested = http_call(port(), "POST", "/v1/completions", R"({"prompt":[)" + ids + R"(],"max_tokens":2})");
  ASSERT_EQ(nested.status, 200) << nested.body;
  EXPECT_EQ(cached_tokens(parse(nested.body)), 32);
  expect_openai_error(http_call(port(), "POST", "/v1/completions", R"({"prompt":[[1,2],[3,4]]})"), 400);
  expect_openai_error(http_call(port(), "POST", "/v1/completions", R"({"prompt":[1,-2]})"), 400);
}

TEST_F(SimServerTest, MetricsUseVllmNames) {
  ASSERT_EQ(http_call(port(), "POST", "/v1/completions", R"({"prompt":"metrics please","max_tokens":2})").status, 200);
  HttpReply r = http_call(port(), "GET", "/metrics");
  ASSERT_EQ(r.status, 200);
  EXPECT_NE(r.content_type.find("text/plain"), std::string::npos);
  for (const char* name :
       {"vllm:num_requests_running{", "vllm:num_requests_waiting{", "vllm:kv_cache_usage_perc{",
        "vllm:prefix_cache_queries_total{", "vllm:prefix_cache_hits_total{", "vllm:prompt_tokens_total{",
        "vllm:generation_tokens_total{", "vllm:time_to_first_token_seconds_bucket{",
        "vllm:time_to_first_token_seconds_count{", "vllm:request_success_total{"}) {
    EXPECT_NE(r.body.find(name), std::string::npos) << name;
  }
  const auto info = r.body.find("vllm:cache_config_info{");
  ASSERT_NE(info, std::string::npos);
  const std::string line = r.body.substr(info, r.body.find('\n', info) - info);
  EXPECT_NE(line.find("block_size=\"16\""), std::string::npos) << line;
  EXPECT_NE(line.find("num_gpu_blocks=\"4096\""), std::string::npos) << line;
}

// promtool's lint (the one a Prometheus operator runs) on the real /metrics: only vLLM's ':' names may draw a
// complaint. Every family has HELP and TYPE naming its samples (a counter's with _total, as prometheus_client
// writes vLLM's), so nothing is untyped or missing help.
TEST_F(SimServerTest, MetricsPassPromtoolButForColonNames) {
  if (std::system("command -v promtool >/dev/null 2>&1") != 0) GTEST_SKIP() << "promtool is not installed (Debian: prometheus)";
  ASSERT_EQ(http_call(port(), "POST", "/v1/completions", R"({"prompt":"lint me","max_tokens":2})").status, 200);
  HttpReply r = http_call(port(), "GET", "/metrics");
  ASSERT_EQ(r.status, 200);
  char path[] = "/tmp/kvroute-sim-metrics-XXXXXX";
  const int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, r.body.data(), r.body.size()), static_cast<ssize_t>(r.body.size()));
  ::close(fd);
  FILE* out = ::popen(("promtool check metrics < " + std::string(path) + " 2>&1").c_str(), "r");
  ASSERT_NE(out, nullptr);
  std::string report;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, out)) > 0;) report.append(buf, n);
  ::pclose(out);
  ::unlink(path);
  std::size_t complaints = 0;
  for (std::size_t at = 0, nl; at < report.size(); at = nl + 1) {
    nl = report.find('\n', at);
    if (nl == std::string::npos) nl = report.size();
    const std::string line = report.substr(at, nl - at);
    if (line.empty()) continue;
    ++complaints;
    EXPECT_TRUE(line.ends_with("metric names should not contain ':'")) << line;
  }
  EXPECT_GT(complaints, 0u);  // the colon names are there, so promtool did read the exposition
}

TEST_F(SimServerTest, DebugKvBlocksListsHeldHashes) {
  const std::string body = json::serialize(json::object{{"prompt", long_prompt("debug-blocks")}, {"max_tokens", 1}});
  ASSERT_EQ(http_call(port(), "POST", "/v1/completions", body).status, 200);
  HttpReply r = http_call(port(), "GET", "/debug/kv_blocks");
  ASSERT_EQ(r.status, 200);
  json::value v = parse(r.body);
  EXPECT_EQ(v.at("block_size").as_int64(), 16);
  const auto& gpu = v.at("gpu").as_array();
  EXPECT_GE(gpu.size(), 20u);
  for (const auto& h : gpu) {
    ASSERT_TRUE(h.is_string());
    const std::string s(h.as_string());
    EXPECT_EQ(s.find_first_not_of("0123456789"), std::string::npos) << s;
  }
  EXPECT_TRUE(v.at("cpu").as_array().empty());
}

TEST_F(SimServerTest, BadInputGetsOpenAiErrorsAndServerKeepsServing) {
  expect_openai_error(http_call(port(), "POST", "/v1/completions", "{not json"), 400);
  expect_openai_error(http_call(port(), "POST", "/v1/completions", R"({"max_tokens":3})"), 400);
  expect_openai_error(http_call(port(), "POST", "/v1/completions", R"({"prompt":"x","max_tokens":-1})"), 400);
  expect_openai_error(http_call(port(), "POST", "/v1/completions", R"({"prompt":"x","max_tokens":"many"})"), 400);
  expect_openai_error(http_call(port(), "POST", "/v1/completions", R"({"prompt":"x","stream":"yes"})"), 400);
  expect_openai_error(http_call(port(), "POST", "/v1/completions", R"({"prompt":""})"), 400);
  expect_openai_error(http_call(port(), "POST", "/v1/completions", R"({"prompt":"x","n":2})"), 400);
  expect_openai_error(http_call(port(), "POST", "/v1/completions", R"({"prompt":"x","max_tokens":100000000})"), 400);
  expect_openai_error(http_call(port(), "POST", "/v1/chat/completions", R"({"messages":"hello"})"), 400);
  expect_openai_error(http_call(port(), "POST", "/v1/chat/completions", R"({"messages":[{"content":"no role"}]})"), 400);
  expect_openai_error(http_call(port(), "POST", "/v1/completions", R"({"model":"other","prompt":"x"})"), 404);
  expect_openai_error(http_call(port(), "POST", "/tokenize", R"({"prompt":3})"), 400);
  expect_openai_error(http_call(port(), "GET", "/v1/completions"), 405);
  expect_openai_error(http_call(port(), "GET", "/no/such/path"), 404);
  expect_openai_error(http_call(port(), "POST", "/v1/completions", std::string(100000, ' ')), 413);
  ASSERT_TRUE(sim_->alive());
  HttpReply ok = http_call(port(), "POST", "/v1/completions", R"({"prompt":"still alive?","max_tokens":1})");
  EXPECT_EQ(ok.status, 200) << ok.body;
}

TEST_F(SimServerTest, KeepAliveServesManyRequestsOnOneConnection) {
  // http_call opens a connection per call; here one raw connection carries three requests.
  namespace net = boost::asio;
  net::io_context io;
  net::ip::tcp::socket s(io);
  boost::system::error_code ec;
  s.connect({net::ip::make_address("127.0.0.1"), port()}, ec);
  ASSERT_FALSE(ec);
  const std::string req = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  std::string all = req + req + req;  // pipelined
  net::write(s, net::buffer(all), ec);
  ASSERT_FALSE(ec);
  std::string got;
  char buf[4096];
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < deadline) {
    std::size_t n = s.read_some(net::buffer(buf), ec);
    if (ec) break;
    got.append(buf, n);
    std::size_t count = 0;
    for (std::size_t p = got.find("HTTP/1.1 200"); p != std::string::npos; p = got.find("HTTP/1.1 200", p + 1)) ++count;
    if (count == 3) break;
  }
  std::size_t count = 0;
  for (std::size_t p = got.find("HTTP/1.1 200"); p != std::string::npos; p = got.find("HTTP/1.1 200", p + 1)) ++count;
  EXPECT_EQ(count, 3u) << got;
}

// Reads the value of a metric line that starts with `prefix`.
double metric(const std::string& text, const std::string& prefix) {
  const auto p = text.find("\n" + prefix);
  if (p == std::string::npos) return -1;
  const auto eol = text.find('\n', p + 1);
  const std::string line = text.substr(p + 1, eol - p - 1);
  return std::atof(line.substr(line.rfind(' ') + 1).c_str());
}

// ---- Responses API ----

bool is_hex_id(std::string_view id, std::string_view prefix) {
  return id.size() == prefix.size() + 32 && id.starts_with(prefix) &&
         id.find_first_not_of("0123456789abcdef", prefix.size()) == std::string_view::npos;
}

std::int64_t input_tokens(const json::value& response) { return response.at("usage").at("input_tokens").as_int64(); }
std::int64_t cached_input_tokens(const json::value& response) {
  return response.at("usage").at("input_tokens_details").at("cached_tokens").as_int64();
}
std::string output_text(const json::value& response) {
  return std::string(response.at("output").at(0).at("content").at(0).at("text").as_string());
}

HttpReply create_response(std::uint16_t port, const json::object& body) {
  return http_call(port, "POST", "/v1/responses", json::serialize(body));
}

// The prompt tokens the chat template gives `messages` (the worker's /tokenize).
std::int64_t chat_token_count(std::uint16_t port, const json::array& messages) {
  HttpReply r = http_call(port, "POST", "/tokenize", json::serialize(json::object{{"messages", messages}}));
  EXPECT_EQ(r.status, 200) << r.body;
  return parse(r.body).at("count").as_int64();
}

void expect_response_not_found(const HttpReply& r, const std::string& id) {
  EXPECT_EQ(r.status, 404) << r.body;
  json::value v = parse(r.body);
  EXPECT_EQ(v.at("error").at("message").as_string(), "Response with id '" + id + "' not found.");
  EXPECT_EQ(v.at("error").at("type").as_string(), "invalid_request_error");
  EXPECT_EQ(v.at("error").at("code").as_int64(), 404);
}

TEST_F(SimServerTest, ResponsesCreateNonStreaming) {
  HttpReply r = create_response(port(), {{"model", "sim-model"}, {"instructions", "Be brief."},
                                         {"input", "What is a prefix cache?"}, {"max_output_tokens", 5},
                                         {"temperature", 0.5}});  // unknown fields are ignored
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_NE(r.content_type.find("application/json"), std::string::npos);
  EXPECT_EQ(r.body.rfind(R"({"id":"resp_)", 0), 0u) << "\"id\" must be the first key: " << r.body;
  json::value v = parse(r.body);
  EXPECT_TRUE(is_hex_id(v.at("id").as_string(), "resp_")) << v.at("id");
  EXPECT_EQ(v.at("object").as_string(), "response");
  EXPECT_GT(v.at("created_at").as_int64(), 1700000000);
  EXPECT_EQ(v.at("model").as_string(), "sim-model");
  EXPECT_EQ(v.at("status").as_string(), "completed");
  ASSERT_EQ(v.at("output").as_array().size(), 1u);
  const auto& item = v.at("output").at(0);
  EXPECT_EQ(item.at("type").as_string(), "message");
  EXPECT_TRUE(is_hex_id(item.at("id").as_string(), "msg_")) << item.at("id");
  EXPECT_EQ(item.at("role").as_string(), "assistant");
  EXPECT_EQ(item.at("status").as_string(), "completed");
  EXPECT_EQ(item.at("content").at(0).at("type").as_string(), "output_text");
  EXPECT_FALSE(output_text(v).empty());
  EXPECT_TRUE(item.at("content").at(0).at("annotations").as_array().empty());
  // The prompt is the chat template's rendering of instructions (system) + input (user).
  const std::int64_t p = chat_token_count(port(), json::array{json::object{{"role", "system"}, {"content", "Be brief."}},
                                                              json::object{{"role", "user"}, {"content", "What is a prefix cache?"}}});
  EXPECT_EQ(input_tokens(v), p);
  EXPECT_EQ(v.at("usage").at("output_tokens").as_int64(), 5);
  EXPECT_EQ(v.at("usage").at("total_tokens").as_int64(), p + 5);
  EXPECT_EQ(v.at("usage").at("output_tokens_details").at("reasoning_tokens").as_int64(), 0);
  EXPECT_GE(cached_input_tokens(v), 0);
  // A second response gets another id.
  HttpReply again = create_response(port(), {{"input", "What is a prefix cache?"}, {"max_output_tokens", 1}});
  ASSERT_EQ(again.status, 200) << again.body;
  EXPECT_NE(parse(again.body).at("id"), v.at("id"));
}

TEST_F(SimServerTest, ResponsesFollowUpContinuesTheStoredConversation) {
  const std::string first_input = long_prompt("responses-follow-up");
  HttpReply r1 = create_response(port(), {{"input", first_input}, {"max_output_tokens", 20}});
  ASSERT_EQ(r1.status, 200) << r1.body;
  const json::value v1 = parse(r1.body);
  const std::int64_t p1 = input_tokens(v1);
  const std::int64_t n1 = v1.at("usage").at("output_tokens").as_int64();
  EXPECT_GT(p1, 300);
  EXPECT_EQ(cached_input_tokens(v1), 0);  // a fresh prefix

  HttpReply r2 = create_response(port(), {{"input", json::array{json::object{{"role", "user"}, {"content", "And then?"}}}},
                                          {"previous_response_id", v1.at("id")}, {"max_output_tokens", 3}});
  ASSERT_EQ(r2.status, 200) << r2.body;
  const json::value v2 = parse(r2.body);
  EXPECT_NE(v2.at("id"), v1.at("id"));
  // The follow-up's prompt is the whole conversation through the chat template: turn 1 (its prompt and, as
  // an assistant message, its output) and then the new input.
  const std::int64_t p2 = input_tokens(v2);
  EXPECT_GT(p2, p1 + n1);
  EXPECT_EQ(p2, chat_token_count(port(), json::array{json::object{{"role", "user"}, {"content", first_input}},
                                                     json::object{{"role", "assistant"}, {"content", output_text(v1)}},
                                                     json::object{{"role", "user"}, {"content", "And then?"}}}));
  // Turn 1's tokens are an exact prefix, so the prefix cache serves them: every full block of turn 1's
  // prompt, and of its output too, which the engine caches as decoding fills it (all but the last generated
  // token went through the model).
  EXPECT_GE(cached_input_tokens(v2), p1 / 16 * 16);
  EXPECT_GE(cached_input_tokens(v2), (p1 + n1 - 1) / 16 * 16);
  EXPECT_LT(cached_input_tokens(v2), p2);

  // A chain of three: the follow-up is stored too.
  HttpReply r3 = create_response(port(), {{"input", "Go on."}, {"previous_response_id", v2.at("id")}, {"max_output_tokens", 2}});
  ASSERT_EQ(r3.status, 200) << r3.body;
  EXPECT_GT(input_tokens(parse(r3.body)), p2);
  EXPECT_GE(cached_input_tokens(parse(r3.body)), p1 / 16 * 16);
}

TEST_F(SimServerTest, ResponsesUnknownPreviousIdIs404) {
  const std::string id = "resp_00000000000000000000000000000000";
  expect_response_not_found(create_response(port(), {{"input", "hi"}, {"previous_response_id", id}}), id);
  expect_response_not_found(create_response(port(), {{"input", "hi"}, {"previous_response_id", "nope"}, {"stream", true}}),
                            "nope");
}

TEST_F(SimServerTest, ResponsesGetReturnsTheStoredObject) {
  HttpReply r = create_response(port(), {{"input", "Store me."}, {"max_output_tokens", 4}});
  ASSERT_EQ(r.status, 200) << r.body;
  const std::string id(parse(r.body).at("id").as_string());
  HttpReply got = http_call(port(), "GET", "/v1/responses/" + id);
  ASSERT_EQ(got.status, 200) << got.body;
  EXPECT_NE(got.content_type.find("application/json"), std::string::npos);
  EXPECT_EQ(got.body, r.body);
  EXPECT_EQ(http_call(port(), "GET", "/v1/responses/" + id + "?include=x").body, r.body);  // query ignored
  expect_response_not_found(http_call(port(), "GET", "/v1/responses/resp_unknown"), "resp_unknown");
  expect_openai_error(http_call(port(), "DELETE", "/v1/responses/" + id), 405);
  expect_openai_error(http_call(port(), "POST", "/v1/responses/" + id, "{}"), 405);
  expect_openai_error(http_call(port(), "GET", "/v1/responses"), 405);
  expect_openai_error(http_call(port(), "GET", "/v1/responses/" + id + "/input_items"), 404);
}

// background=true: the POST answers at once with status "queued"; GET shows the response run to completion;
// the completed response is what the same request gives without background, and a follow-up continues it.
TEST_F(SimServerTest, ResponsesInTheBackground) {
  const json::object body{{"input", long_prompt("responses-background")}, {"max_output_tokens", 200}};
  json::object bg_body = body;
  bg_body["background"] = true;
  const auto t0 = std::chrono::steady_clock::now();
  HttpReply r = create_response(port(), bg_body);
  ASSERT_EQ(r.status, 200) << r.body;
  const json::value queued = parse(r.body);
  EXPECT_EQ(queued.at("status").as_string(), "queued");
  EXPECT_TRUE(queued.at("output").as_array().empty());
  EXPECT_TRUE(queued.at("usage").is_null());
  const std::string id(queued.at("id").as_string());
  // 200 tokens at speed 200 take about 20 ms x 200 / 200 = 20 ms of decode at least; the POST did not wait.
  json::value v;
  std::set<std::string> seen;
  for (int i = 0; i < 500; ++i) {
    HttpReply got = http_call(port(), "GET", "/v1/responses/" + id);
    ASSERT_EQ(got.status, 200) << got.body;
    v = parse(got.body);
    seen.insert(std::string(v.at("status").as_string()));
    if (v.at("status").as_string() == "completed") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_EQ(v.at("status").as_string(), "completed") << v;
  for (const auto& s : seen) EXPECT_TRUE(s == "queued" || s == "in_progress" || s == "completed") << s;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  EXPECT_EQ(v.at("usage").at("output_tokens").as_int64(), 200);
  EXPECT_EQ(v.at("id").as_string(), id);
  // The same request without background: the same prompt and output (the sim's text depends on the prompt).
  HttpReply sync = create_response(port(), body);
  ASSERT_EQ(sync.status, 200) << sync.body;
  EXPECT_EQ(input_tokens(parse(sync.body)), input_tokens(v));
  EXPECT_EQ(output_text(parse(sync.body)), output_text(v));
  // The stored conversation is continued by a follow-up, served from the prefix cache.
  HttpReply next = create_response(port(), {{"input", "And then?"}, {"previous_response_id", id}, {"max_output_tokens", 2}});
  ASSERT_EQ(next.status, 200) << next.body;
  EXPECT_GT(input_tokens(parse(next.body)), input_tokens(v));
  EXPECT_GE(cached_input_tokens(parse(next.body)), input_tokens(v) / 16 * 16);
  // A finished response cannot be cancelled (vLLM's answer), an unknown one is a 404.
  HttpReply late = http_call(port(), "POST", "/v1/responses/" + id + "/cancel", "");
  expect_openai_error(late, 400);
  EXPECT_NE(late.body.find("Cannot cancel a synchronous response."), std::string::npos) << late.body;
  expect_response_not_found(http_call(port(), "POST", "/v1/responses/resp_unknown/cancel", ""), "resp_unknown");
  expect_openai_error(http_call(port(), "GET", "/v1/responses/" + id + "/cancel"), 405);
}

// Cancelling a background response stops it: the worker drops the request, GET shows "cancelled" from then
// on, and the engine is free again.
TEST_F(SimServerTest, ResponsesInTheBackgroundAreCancelled) {
  const double cancelled_before = metric(http_call(port(), "GET", "/metrics").body, "kvroute_sim:requests_cancelled_total");
  HttpReply r = create_response(port(), {{"input", long_prompt("responses-cancel")}, {"max_output_tokens", 30000},
                                         {"background", true}});
  ASSERT_EQ(r.status, 200) << r.body;
  const std::string id(parse(r.body).at("id").as_string());
  HttpReply c = http_call(port(), "POST", "/v1/responses/" + id + "/cancel", "");
  ASSERT_EQ(c.status, 200) << c.body;
  const json::value v = parse(c.body);
  EXPECT_EQ(v.at("status").as_string(), "cancelled");
  EXPECT_EQ(v.at("id").as_string(), id);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  HttpReply got = http_call(port(), "GET", "/v1/responses/" + id);
  ASSERT_EQ(got.status, 200);
  EXPECT_EQ(parse(got.body).at("status").as_string(), "cancelled");
  EXPECT_EQ(metric(http_call(port(), "GET", "/metrics").body, "kvroute_sim:requests_cancelled_total"), cancelled_before + 1);
  EXPECT_EQ(metric(http_call(port(), "GET", "/metrics").body, "vllm:num_requests_running"), 0);
  expect_openai_error(http_call(port(), "POST", "/v1/responses/" + id + "/cancel", ""), 400);  // already cancelled
}

TEST_F(SimServerTest, ResponsesStreaming) {
  HttpReply r = create_response(port(), {{"input", long_prompt("responses-stream")}, {"max_output_tokens", 4}, {"stream", true}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_NE(r.content_type.find("text/event-stream"), std::string::npos);
  EXPECT_EQ(r.body.find("[DONE]"), std::string::npos) << r.body;
  const auto events = sse_events(r.body);
  // created, in_progress, item and part added, 4 deltas, text, part and item done, completed
  const std::vector<std::string> types = {"response.created",           "response.in_progress",
                                          "response.output_item.added", "response.content_part.added",
                                          "response.output_text.delta", "response.output_text.delta",
                                          "response.output_text.delta", "response.output_text.delta",
                                          "response.output_text.done",  "response.content_part.done",
                                          "response.output_item.done",  "response.completed"};
  ASSERT_EQ(events.size(), types.size()) << r.body;
  EXPECT_EQ(events.front().data.rfind(R"({"type":"response.created","sequence_number":0,"response":{"id":"resp_)", 0), 0u)
      << events.front().data;
  const json::value created = parse(events.front().data);
  const json::value id = created.at("response").at("id");
  EXPECT_EQ(created.at("response").at("status").as_string(), "in_progress");
  EXPECT_TRUE(created.at("response").at("usage").is_null());
  std::string text;
  std::string item_id;
  for (std::size_t k = 0; k < events.size(); ++k) {
    EXPECT_EQ(events[k].event, types[k]);
    const json::value e = parse(events[k].data);
    EXPECT_EQ(e.at("type").as_string(), events[k].event);
    EXPECT_EQ(e.at("sequence_number").as_int64(), static_cast<std::int64_t>(k));
    if (events[k].event == "response.output_item.added") item_id = std::string(e.at("item").at("id").as_string());
    if (events[k].event != "response.output_text.delta") continue;
    text += std::string(e.at("delta").as_string());
    EXPECT_EQ(e.at("item_id").as_string(), item_id);
  }
  EXPECT_EQ(parse(events[8].data).at("text").as_string(), text);
  EXPECT_EQ(events.back().event, "response.completed");
  const json::value done = parse(events.back().data).at("response");
  EXPECT_EQ(done.at("id"), id);
  EXPECT_EQ(done.at("status").as_string(), "completed");
  EXPECT_EQ(done.at("output").at(0).at("id").as_string(), item_id);
  EXPECT_EQ(output_text(done), text);
  EXPECT_EQ(done.at("usage").at("output_tokens").as_int64(), 4);
  EXPECT_GT(input_tokens(done), 300);
  EXPECT_GE(cached_input_tokens(done), 0);
  // Stored as the non-streaming object, and chainable.
  HttpReply got = http_call(port(), "GET", "/v1/responses/" + std::string(id.as_string()));
  ASSERT_EQ(got.status, 200);
  EXPECT_EQ(parse(got.body), done);
  HttpReply next = create_response(port(), {{"input", "More."}, {"previous_response_id", id}, {"stream", true}});
  ASSERT_EQ(next.status, 200) << next.body;
  const json::value next_done = parse(sse_events(next.body).back().data).at("response");
  EXPECT_GE(cached_input_tokens(next_done), input_tokens(done) / 16 * 16);
}

TEST_F(SimServerTest, ResponsesStoreFalseIsNotKept) {
  HttpReply r = create_response(port(), {{"input", "Forget me."}, {"store", false}, {"max_output_tokens", 2}});
  ASSERT_EQ(r.status, 200) << r.body;
  const std::string id(parse(r.body).at("id").as_string());
  EXPECT_TRUE(is_hex_id(id, "resp_"));
  expect_response_not_found(http_call(port(), "GET", "/v1/responses/" + id), id);
  expect_response_not_found(create_response(port(), {{"input", "hi"}, {"previous_response_id", id}}), id);
  HttpReply s = create_response(port(), {{"input", "Forget me too."}, {"store", false}, {"stream", true}});
  ASSERT_EQ(s.status, 200) << s.body;
  const std::string sid(parse(sse_events(s.body).front().data).at("response").at("id").as_string());
  expect_response_not_found(create_response(port(), {{"input", "hi"}, {"previous_response_id", sid}}), sid);
}

TEST_F(SimServerTest, ResponsesBadInput) {
  expect_openai_error(http_call(port(), "POST", "/v1/responses", "{not json"), 400);
  expect_openai_error(http_call(port(), "POST", "/v1/responses", R"({"model":"sim-model"})"), 400);
  expect_openai_error(http_call(port(), "POST", "/v1/responses", R"({"input":[]})"), 400);
  expect_openai_error(http_call(port(), "POST", "/v1/responses", R"({"input":[{"role":"robot","content":"x"}]})"), 400);
  expect_openai_error(http_call(port(), "POST", "/v1/responses", R"({"input":"x","max_output_tokens":0})"), 400);
  expect_openai_error(http_call(port(), "POST", "/v1/responses", R"({"input":"x","max_output_tokens":100000000})"), 400);
  HttpReply model = http_call(port(), "POST", "/v1/responses", R"({"model":"other","input":"x"})");
  expect_openai_error(model, 404);
  EXPECT_EQ(parse(model.body).at("error").at("code").as_string(), "model_not_found");
  HttpReply missing = http_call(port(), "POST", "/v1/responses", R"({"input":""})");
  expect_openai_error(missing, 400);
  EXPECT_NE(missing.body.find("'input' must not be empty"), std::string::npos) << missing.body;
}

// Responses requests go through the engine like chat: the same vLLM counters move by the same amounts.
TEST_F(SimServerTest, ResponsesCountInTheMetrics) {
  auto snapshot = [&] { return http_call(port(), "GET", "/metrics").body; };
  const std::string before = snapshot();
  HttpReply r = create_response(port(), {{"input", long_prompt("responses-metrics")}, {"max_output_tokens", 6}});
  ASSERT_EQ(r.status, 200) << r.body;
  const json::value v = parse(r.body);
  const std::string after = snapshot();
  auto delta = [&](const std::string& prefix) { return metric(after, prefix) - metric(before, prefix); };
  EXPECT_EQ(delta("vllm:request_success_total{"), 1);
  EXPECT_EQ(delta("vllm:generation_tokens_total{"), 6);
  EXPECT_EQ(delta("vllm:prefix_cache_queries_total{"), input_tokens(v));
  EXPECT_EQ(delta("vllm:prompt_tokens_total{"), input_tokens(v) - cached_input_tokens(v));
  EXPECT_EQ(delta("vllm:time_to_first_token_seconds_count{"), 1);
}

TEST(SimServerProcessTest, ClientDisconnectCancelsRequest) {
  SimProcess sim({"--speed", "1"});
  ASSERT_TRUE(sim.ready());
  namespace net = boost::asio;
  // A completion and a Responses API request, each streaming and not.
  for (int k = 0; k < 4; ++k) {
    const bool stream = k % 2 == 1;
    const bool responses = k >= 2;
    net::io_context io;
    net::ip::tcp::socket s(io);
    boost::system::error_code ec;
    s.connect({net::ip::make_address("127.0.0.1"), sim.port()}, ec);
    ASSERT_FALSE(ec);
    const std::string body = std::string(responses ? R"({"input":"a long generation","max_output_tokens":5000,"stream":)"
                                                   : R"({"prompt":"a long generation","max_tokens":5000,"stream":)") +
                             (stream ? "true" : "false") + "}";
    const std::string req = std::string("POST ") + (responses ? "/v1/responses" : "/v1/completions") +
                            " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                            "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    net::write(s, net::buffer(req), ec);
    ASSERT_FALSE(ec);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    s.close();
  }
  double cancelled = -1;
  double running = -1;
  for (int i = 0; i < 100; ++i) {
    const std::string m = http_call(sim.port(), "GET", "/metrics").body;
    cancelled = metric(m, "kvroute_sim:requests_cancelled_total");
    running = metric(m, "vllm:num_requests_running");
    if (cancelled >= 4 && running == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(cancelled, 4);
  EXPECT_EQ(running, 0);
}

TEST(SimServerProcessTest, WorkersAreIndependent) {
  SimProcess sim({"--speed", "100", "--served-model-name", "m"}, 2);
  ASSERT_TRUE(sim.ready());
  const std::string body = json::serialize(json::object{{"prompt", long_prompt("two-workers")}, {"max_tokens", 1}});
  ASSERT_EQ(http_call(sim.port(0), "POST", "/v1/completions", body).status, 200);
  EXPECT_FALSE(parse(http_call(sim.port(0), "GET", "/debug/kv_blocks").body).at("gpu").as_array().empty());
  EXPECT_TRUE(parse(http_call(sim.port(1), "GET", "/debug/kv_blocks").body).at("gpu").as_array().empty());
  // Worker 1 has not seen the prefix: no cached tokens there.
  EXPECT_EQ(cached_tokens(parse(http_call(sim.port(1), "POST", "/v1/completions", body).body)), 0);
  // vLLM's /reset_prefix_cache empties the cache.
  EXPECT_EQ(http_call(sim.port(0), "POST", "/reset_prefix_cache").status, 200);
  EXPECT_TRUE(parse(http_call(sim.port(0), "GET", "/debug/kv_blocks").body).at("gpu").as_array().empty());
  EXPECT_EQ(sim.terminate(), 0);  // SIGTERM is a clean shutdown
}

// vLLM keeps stored responses in the memory of the server that made them: worker 1 of the same process,
// and another process, do not know worker 0's response.
// --api-key, as vllm serve --api-key: /v1 routes want the key as a bearer token; health, metrics and
// tokenize stay open.
TEST(SimServerProcessTest, ApiKeyGuardsTheV1Routes) {
  SimProcess sim({"--api-key", "sekret", "--speed", "100"});
  ASSERT_TRUE(sim.ready());
  for (const std::string& auth : {std::string(), std::string("Bearer wrong"), std::string("sekret"),
                                  std::string("Bearer sekret2"), std::string("Basic sekret")}) {
    HttpReply r = http_call(sim.port(), "GET", "/v1/models", "", auth);
    EXPECT_EQ(r.status, 401) << auth;
    EXPECT_EQ(r.body, R"({"error":"Unauthorized"})");
  }
  EXPECT_EQ(http_call(sim.port(), "POST", "/v1/completions", R"({"prompt":"hi","max_tokens":1})").status, 401);
  EXPECT_EQ(http_call(sim.port(), "GET", "/v1/models", "", "Bearer sekret").status, 200);
  EXPECT_EQ(http_call(sim.port(), "POST", "/v1/completions", R"({"prompt":"hi","max_tokens":1})", "Bearer sekret").status,
            200);
  EXPECT_EQ(http_call(sim.port(), "GET", "/health").status, 200);
  EXPECT_EQ(http_call(sim.port(), "GET", "/metrics").status, 200);
  EXPECT_EQ(http_call(sim.port(), "POST", "/tokenize", R"({"prompt":"hi"})").status, 200);
}

// LoRA adapters, as vLLM serves them: listed by /v1/models with the base model as parent, named by requests as
// their model, with a cache namespace of their own; loaded and unloaded at run time with vLLM's answers.
TEST(SimServerProcessTest, LoraAdapters) {
  SimProcess sim({"--lora-modules", "sql=/adapters/sql", "--speed", "100", "--served-model-name", "base"});
  ASSERT_TRUE(sim.ready());
  json::value models = parse(http_call(sim.port(), "GET", "/v1/models").body);
  ASSERT_EQ(models.at("data").as_array().size(), 2u);
  EXPECT_EQ(models.at("data").at(1).at("id").as_string(), "sql");
  EXPECT_EQ(models.at("data").at(1).at("parent").as_string(), "base");
  EXPECT_EQ(models.at("data").at(1).at("root").as_string(), "/adapters/sql");

  const std::string prompt = long_prompt("lora-namespace");
  auto complete = [&](const std::string& model) {
    HttpReply r = http_call(sim.port(), "POST", "/v1/completions",
                            json::serialize(json::object{{"model", model}, {"prompt", prompt}, {"max_tokens", 1}}));
    EXPECT_EQ(r.status, 200) << r.body;
    return parse(r.body).at("usage").at("prompt_tokens_details").at("cached_tokens").as_int64();
  };
  EXPECT_EQ(complete("sql"), 0);
  EXPECT_GT(complete("sql"), 300);  // the adapter's own blocks
  EXPECT_EQ(complete("base"), 0);   // the same tokens under the base model are other blocks
  EXPECT_GT(complete("base"), 300);

  HttpReply load = http_call(sim.port(), "POST", "/v1/load_lora_adapter", R"({"lora_name":"chat","lora_path":"/a/chat"})");
  EXPECT_EQ(load.status, 200);
  EXPECT_EQ(load.body, "Success: LoRA adapter 'chat' added successfully.");
  HttpReply again = http_call(sim.port(), "POST", "/v1/load_lora_adapter", R"({"lora_name":"chat","lora_path":"/a/chat"})");
  EXPECT_EQ(again.status, 400);
  EXPECT_NE(again.body.find("The lora adapter 'chat' has already been loaded."), std::string::npos);
  EXPECT_EQ(http_call(sim.port(), "POST", "/v1/load_lora_adapter", R"({"lora_name":"x"})").status, 400);
  EXPECT_EQ(complete("chat"), 0);
  EXPECT_EQ(http_call(sim.port(), "POST", "/v1/unload_lora_adapter", R"({"lora_name":"chat"})").status, 200);
  HttpReply gone = http_call(sim.port(), "POST", "/v1/unload_lora_adapter", R"({"lora_name":"chat"})");
  EXPECT_EQ(gone.status, 404);
  EXPECT_NE(gone.body.find("The lora adapter 'chat' cannot be found."), std::string::npos);
  EXPECT_EQ(http_call(sim.port(), "POST", "/v1/completions", R"({"model":"chat","prompt":"hi"})").status, 404);
  EXPECT_EQ(parse(http_call(sim.port(), "GET", "/v1/models").body).at("data").as_array().size(), 2u);
}

TEST(SimServerProcessTest, ResponsesAreStoredPerWorker) {
  SimProcess sim({"--speed", "100", "--served-model-name", "m"}, 2);
  ASSERT_TRUE(sim.ready());
  HttpReply r = create_response(sim.port(0), {{"input", long_prompt("per-worker")}, {"max_output_tokens", 2}});
  ASSERT_EQ(r.status, 200) << r.body;
  const std::string id(parse(r.body).at("id").as_string());
  const json::object follow_up{{"input", "Next."}, {"previous_response_id", id}, {"max_output_tokens", 1}};
  expect_response_not_found(create_response(sim.port(1), follow_up), id);
  expect_response_not_found(http_call(sim.port(1), "GET", "/v1/responses/" + id), id);
  HttpReply on_owner = create_response(sim.port(0), follow_up);
  ASSERT_EQ(on_owner.status, 200) << on_owner.body;
  EXPECT_GE(cached_input_tokens(parse(on_owner.body)), input_tokens(parse(r.body)) / 16 * 16);

  SimProcess other({"--speed", "100", "--served-model-name", "m"});
  ASSERT_TRUE(other.ready());
  expect_response_not_found(create_response(other.port(), follow_up), id);
  HttpReply mine = create_response(other.port(), {{"input", "Hello."}, {"max_output_tokens", 1}});
  ASSERT_EQ(mine.status, 200) << mine.body;
  EXPECT_NE(parse(mine.body).at("id").as_string(), id);
}

TEST(SimServerProcessTest, CpuTierKeepsEvictedBlocks) {
  // 16 GPU blocks; seven 60-token prompts (3 blocks each) evict the first ones to the CPU tier.
  SimProcess sim({"--speed", "100", "--num-gpu-blocks", "16", "--cpu-tier-gb", "1"});
  ASSERT_TRUE(sim.ready());
  auto prompt = [](int i) {
    std::string s;
    for (int k = 0; k < 20; ++k) s += (k ? " p" : "p") + std::to_string(i) + "-w" + std::to_string(k);
    return json::serialize(json::object{{"prompt", s}, {"max_tokens", 2}});
  };
  for (int i = 1; i <= 7; ++i) ASSERT_EQ(http_call(sim.port(), "POST", "/v1/completions", prompt(i)).status, 200);
  json::value blocks = parse(http_call(sim.port(), "GET", "/debug/kv_blocks").body);
  EXPECT_FALSE(blocks.at("cpu").as_array().empty());
  // The first prompt comes back from the CPU tier: reported as cached, like vLLM with KV offloading.
  HttpReply again = http_call(sim.port(), "POST", "/v1/completions", prompt(1));
  EXPECT_GE(cached_tokens(parse(again.body)), 48);
}

// --prefix-commit through the real process: a 30,000-token leader prefills in four chunks (8,192 tokens each, then
// 5,424); a follower sharing all of it arrives while the first chunks run, so it can only be admitted into the
// leader's last step, next to its final chunk. Committing at step end (the default), the follower finds the first
// three chunks; committing at schedule time (vLLM v1), it finds all of the leader's blocks.
TEST(SimServerProcessTest, PrefixCommitDecidesWhatAFollowerInTheLeadersLastStepFinds) {
  auto body = [](int extra) {
    json::array ids;
    for (int i = 0; i < 30000; ++i) ids.push_back(1000 + i % 50000);
    for (int i = 0; i < extra; ++i) ids.push_back(60000 + i);
    return json::serialize(json::object{{"prompt", ids}, {"max_tokens", 1}});
  };
  for (const std::string commit : {"step-end", "schedule"}) {
    SimProcess sim({"--speed", "1", "--prefix-commit", commit, "--max-body-bytes", "1000000"});
    ASSERT_TRUE(sim.ready()) << commit;
    HttpReply leader;
    std::thread t([&] { leader = http_call(sim.port(), "POST", "/v1/completions", body(0)); });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    HttpReply follower = http_call(sim.port(), "POST", "/v1/completions", body(16));
    t.join();
    ASSERT_EQ(leader.status, 200) << leader.body;
    ASSERT_EQ(follower.status, 200) << follower.body;
    EXPECT_EQ(cached_tokens(parse(leader.body)), 0);
    EXPECT_EQ(cached_tokens(parse(follower.body)), commit == "schedule" ? 30000 : 3 * 8192) << commit;
  }
}

int run_sim(std::vector<std::string> args, std::string* out = nullptr) {
  const char* dir = std::getenv("KVROUTE_BIN_DIR");
  std::string cmd = std::string(dir ? dir : "bin") + "/kvroute-sim";
  for (auto& a : args) cmd += " '" + a + "'";
  cmd += " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) {
    if (out) out->append(buf, n);
  }
  const int status = ::pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(SimServerCliTest, BadFlagsExitWithStatus2) {
  std::string out;
  EXPECT_EQ(run_sim({"--no-such-flag"}, &out), 2);
  EXPECT_NE(out.find("unknown flag"), std::string::npos) << out;
  EXPECT_EQ(run_sim({"--port", "http"}), 2);
  EXPECT_EQ(run_sim({"--speed", "0"}), 2);
  EXPECT_EQ(run_sim({"--kv-events-encoding", "json"}), 2);
  out.clear();
  EXPECT_EQ(run_sim({"--prefix-commit", "later"}, &out), 2);
  EXPECT_NE(out.find("step-end or schedule"), std::string::npos) << out;
  EXPECT_EQ(run_sim({"--model", "no-such-model"}), 2);
  out.clear();
  EXPECT_EQ(run_sim({"--help"}, &out), 0);
  for (const char* flag : {"--host", "--port", "--workers", "--model", "--model-config", "--gpu", "--cpu-tier-gb",
                           "--prefix-commit", "--speed", "--num-gpu-blocks", "--max-num-seqs", "--kv-events-port",
                           "--kv-events-encoding", "--seed", "--served-model-name"}) {
    EXPECT_NE(out.find(flag), std::string::npos) << flag;
  }
}

TEST(SimServerCliTest, KvSizeSubcommand) {
  std::string out;
  EXPECT_EQ(run_sim({"kv-size", "llama-3.1-8b", "--gpu", "h100-80gb"}, &out), 0) << out;
  EXPECT_NE(out.find("131072"), std::string::npos) << out;  // 128 KiB per token
  EXPECT_EQ(run_sim({"kv-size", "no-such-model"}), 2);
}

}  // namespace
}  // namespace kvroute::sim::testing
