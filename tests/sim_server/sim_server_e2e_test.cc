// End-to-end tests of kvroute-sim's HTTP surface: the real binary on loopback, driven over HTTP.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <boost/json/value.hpp>

#include <chrono>
#include <cstdlib>
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

TEST(SimServerProcessTest, ClientDisconnectCancelsRequest) {
  SimProcess sim({"--speed", "1"});
  ASSERT_TRUE(sim.ready());
  namespace net = boost::asio;
  for (bool stream : {false, true}) {
    net::io_context io;
    net::ip::tcp::socket s(io);
    boost::system::error_code ec;
    s.connect({net::ip::make_address("127.0.0.1"), sim.port()}, ec);
    ASSERT_FALSE(ec);
    const std::string body = std::string(R"({"prompt":"a long generation","max_tokens":5000,"stream":)") +
                             (stream ? "true" : "false") + "}";
    const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
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
    if (cancelled >= 2 && running == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(cancelled, 2);
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
