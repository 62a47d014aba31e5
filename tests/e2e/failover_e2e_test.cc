// Failing workers routed around, end to end (issue 24, "Failures routed around"): real kvroute and kvroute-sim
// processes, the faults injected by kvroute-sim --fault (a worker answering 503, one that never answers) or by
// killing a worker mid-stream, and the pooled connections a worker closes looked for in the kernel's socket
// table.
#include <fstream>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "tests/support/harness.h"

namespace kvroute::test {
namespace {

using namespace std::chrono_literals;

std::string chat(const std::string& text, int max_tokens, bool stream) {
  std::string body = R"({"model": "qwen3-8b", "messages": [{"role": "user", "content": ")" + text +
                     R"("}], "max_tokens": )" + std::to_string(max_tokens);
  if (stream) body += R"(, "stream": true)";
  return body + "}";
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A router in front of the given worker ports, its stdout (access log) and stderr in `log`.
class Failover : public ::testing::Test {
 protected:
  Process sim(const std::vector<std::string>& extra, int& port, const std::string& name) {
    port = free_port();
    std::vector<std::string> argv = {bin("kvroute-sim"), "--port", std::to_string(port), "--workers", "1"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    Process p = Process::start(argv, ::testing::TempDir() + "/kvroute-failover-" + name + ".log");
    EXPECT_TRUE(wait_http(port, "/health", 10s));
    return p;
  }
  void start_router(const std::vector<int>& workers, const std::vector<std::string>& extra) {
    api_ = free_port();
    admin_ = free_port();
    log_ = ::testing::TempDir() + "/kvroute-failover-router.log";
    std::remove(log_.c_str());
    std::vector<std::string> argv = {bin("kvroute"), "--listen", "127.0.0.1:" + std::to_string(api_), "--admin-listen",
                                     "127.0.0.1:" + std::to_string(admin_), "--access-log", "true"};
    for (int w : workers) {
      argv.push_back("--worker");
      argv.push_back("http://127.0.0.1:" + std::to_string(w));
    }
    argv.insert(argv.end(), extra.begin(), extra.end());
    router_ = Process::start(argv, log_);
    ASSERT_TRUE(wait_http(api_, "/health", 10s));
  }
  double metric(const std::string& name) { return metric_sum(http(admin_, "GET", "/metrics").body, name); }

  int api_ = 0, admin_ = 0;
  std::string log_;
  Process router_;
};

TEST_F(Failover, AWorkerAnswering503IsRoutedAroundAndEjected) {
  int good = 0, bad = 0;
  Process g = sim({"--speed", "50"}, good, "good");
  Process b = sim({"--fault", "503"}, bad, "bad503");
  start_router({good, bad}, {"--policy", "round_robin"});
  int ok = 0;
  for (int i = 0; i < 20; ++i) {
    auto r = http(api_, "POST", "/v1/chat/completions", chat("hello " + std::to_string(i), 2, i % 2 == 0));
    EXPECT_EQ(r.status, 200) << r.body;
    ok += r.status == 200;
  }
  EXPECT_EQ(ok, 20) << "every request is served by the good worker";
  EXPECT_GE(metric("kvroute_retries_total{kind=\"status\"}"), 1);
  EXPECT_EQ(metric("kvroute_worker_ejections_total"), 1);
  EXPECT_EQ(metric("kvroute_workers_ejected"), 1);
  const std::string workers = http(admin_, "GET", "/admin/workers").body;
  const auto at = workers.find("127.0.0.1:" + std::to_string(bad));
  ASSERT_NE(at, std::string::npos) << workers;
  const std::string entry = workers.substr(at, workers.find('}', at) - at);
  EXPECT_NE(entry.find("\"ejected\":true"), std::string::npos) << entry;
  EXPECT_NE(entry.find("\"ejections\":1"), std::string::npos) << entry;
  EXPECT_NE(entry.find("\"ejected_until\""), std::string::npos) << entry;
  // Retried requests say so in the access log.
  EXPECT_NE(read_file(log_).find("\"retries\":1"), std::string::npos);
}

TEST_F(Failover, AWorkerThatNeverAnswersCostsAFirstByteTimeoutNotTheRequestTimeout) {
  int good = 0, hung = 0;
  Process g = sim({"--speed", "50"}, good, "good");
  Process h = sim({"--fault", "hang"}, hung, "hang");
  start_router({good, hung}, {"--policy", "round_robin", "--first-byte-timeout", "1"});
  for (int i = 0; i < 12; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    std::string body;
    auto r = http_stream(api_, "POST", "/v1/chat/completions", chat("hang " + std::to_string(i), 4, true), {},
                         [&](const std::string& piece, auto) { body += piece; });
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_NE(body.find("data: [DONE]"), std::string::npos) << body;
    EXPECT_LT(took, 4.0) << "request " << i << " waited for the hung worker beyond --first-byte-timeout";
  }
  EXPECT_GE(metric("kvroute_retries_total{kind=\"first_byte_timeout\"}"), 1);
  EXPECT_EQ(metric("kvroute_workers_ejected"), 1) << "five timeouts in a row eject it";
}

// An unstreamed answer comes only after its last token, so no first-byte bound fits it; but once its worker is
// ejected (here by a stream's first-byte timeout), the unstreamed request waiting on it goes to another worker
// at its next look (every --health-interval), not after the whole --request-timeout.
TEST_F(Failover, AnUnstreamedRequestLeavesAWorkerEjectedWhileItWaits) {
  int good = 0, hung = 0;
  Process g = sim({"--speed", "50"}, good, "good2");
  Process h = sim({"--fault", "hang"}, hung, "hang2");
  start_router({good, hung}, {"--policy", "round_robin", "--first-byte-timeout", "1", "--outlier-failures", "1",
                              "--health-interval", "0.5", "--request-timeout", "60"});
  // Round robin sends one of the two to each worker: one waits on the hung worker.
  std::vector<HttpResponse> whole(2);
  std::vector<double> took(2);
  std::vector<std::thread> clients;
  for (int i = 0; i < 2; ++i) {
    clients.emplace_back([&, i] {
      const auto t0 = std::chrono::steady_clock::now();
      whole[i] = http(api_, "POST", "/v1/chat/completions", chat("whole " + std::to_string(i), 4, false));
      took[i] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    });
  }
  std::this_thread::sleep_for(300ms);
  // Streams until one meets the hung worker: its first-byte timeout ejects it.
  for (int i = 0; i < 4 && metric("kvroute_workers_ejected") == 0; ++i) {
    std::string body;
    auto r = http_stream(api_, "POST", "/v1/chat/completions", chat("probe " + std::to_string(i), 4, true), {},
                         [&](const std::string& piece, auto) { body += piece; });
    EXPECT_EQ(r.status, 200) << r.body;
  }
  ASSERT_EQ(metric("kvroute_workers_ejected"), 1);
  for (auto& c : clients) c.join();
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(whole[i].status, 200) << whole[i].body;
    EXPECT_LT(took[i], 10.0) << "request " << i << " waited on the ejected worker";
  }
  EXPECT_EQ(metric("kvroute_retries_total{kind=\"left_rotation\"}"), 1);
}

TEST_F(Failover, AWorkerKilledMidStreamEndsTheStreamWithAnErrorEvent) {
  int port = 0;
  Process w = sim({"--speed", "1"}, port, "killed");
  start_router({port}, {});
  std::string body;
  bool killed = false;
  auto r = http_stream(api_, "POST", "/v1/chat/completions", chat("a long answer", 4000, true),
                       {{"x-request-id", "cut-stream"}}, [&](const std::string& piece, auto) {
                         body += piece;
                         if (!killed && body.find("data: {") != std::string::npos) {
                           killed = true;
                           w.kill_now();
                         }
                       });
  ASSERT_TRUE(killed) << r.error << " " << body;
  EXPECT_EQ(r.status, 200);
  EXPECT_TRUE(r.error.empty()) << "the stream ends well framed: " << r.error;
  EXPECT_NE(body.find("data: {\"error\":{"), std::string::npos) << body.substr(body.size() > 400 ? body.size() - 400 : 0);
  EXPECT_NE(body.find("\"code\":\"stream_interrupted\""), std::string::npos);
  EXPECT_EQ(body.find("[DONE]"), std::string::npos);
  EXPECT_EQ(metric("kvroute_streams_cut_total"), 1);
  std::this_thread::sleep_for(200ms);
  const std::string log = read_file(log_);
  const auto at = log.find("\"request_id\":\"cut-stream\"");
  ASSERT_NE(at, std::string::npos) << log;
  const std::string line = log.substr(at, log.find('\n', at) - at);
  EXPECT_NE(line.find("\"outcome\":\"stream_cut\""), std::string::npos) << line;
  EXPECT_NE(line.find("\"error\":\"stream_interrupted\""), std::string::npos) << line;
}

// A worker killed mid-stream is checked at once, not at its next health check (60 s away here): out of
// rotation within a second, so no request is sent to it meanwhile and no ejection is spent on it.
TEST_F(Failover, AWorkerKilledMidStreamLeavesRotationAtOnce) {
  int port = 0;
  Process w = sim({"--speed", "1"}, port, "crashed");
  start_router({port}, {"--health-interval", "60"});
  bool killed = false;
  std::string body;
  http_stream(api_, "POST", "/v1/chat/completions", chat("a long answer", 4000, true), {},
              [&](const std::string& piece, auto) {
                body += piece;
                if (!killed && body.find("data: {") != std::string::npos) {
                  killed = true;
                  w.kill_now();
                }
              });
  ASSERT_TRUE(killed) << body;
  const auto killed_at = std::chrono::steady_clock::now();
  bool out = false;
  while (!out && std::chrono::steady_clock::now() - killed_at < 5s) {
    out = http(admin_, "GET", "/admin/workers").body.find("\"healthy\":false") != std::string::npos;
    if (!out) std::this_thread::sleep_for(20ms);
  }
  ASSERT_TRUE(out) << "still in rotation 5 s after it was killed: " << http(admin_, "GET", "/admin/workers").body;
  EXPECT_LT(std::chrono::steady_clock::now() - killed_at, 1s);
  auto r = http(api_, "POST", "/v1/chat/completions", chat("anyone there", 2, false));
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_NE(r.body.find("no_healthy_worker"), std::string::npos) << r.body;
  EXPECT_NE(read_file(log_).find("failed its health checks"), std::string::npos);
}

// Sockets in CLOSE-WAIT whose peer is 127.0.0.1:port, from the kernel's table (the router's network namespace).
int close_wait_to(int port) {
  std::ifstream in("/proc/net/tcp");
  std::string line;
  std::getline(in, line);
  int n = 0;
  char want[8];
  std::snprintf(want, sizeof want, "%04X", port);
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string sl, local, remote, state;
    f >> sl >> local >> remote >> state;
    if (state == "08" && remote.substr(remote.find(':') + 1) == want) ++n;
  }
  return n;
}

TEST_F(Failover, PooledConnectionsTheWorkerClosedAreReaped) {
  int port = 0;
  Process w = sim({"--speed", "50", "--idle-timeout", "1"}, port, "idle");
  start_router({port}, {"--health-interval", "60"});
  // Several at once, so the pool holds several connections.
  std::vector<std::thread> clients;
  for (int i = 0; i < 8; ++i) {
    clients.emplace_back([this, i] {
      for (int j = 0; j < 3; ++j) http(api_, "POST", "/v1/chat/completions", chat("pool " + std::to_string(i), 8, false));
    });
  }
  for (auto& c : clients) c.join();
  // The worker closes its idle keep-alive connections after 1 s; the router's sweep runs every second.
  std::this_thread::sleep_for(3500ms);
  EXPECT_EQ(close_wait_to(port), 0) << "pooled connections the worker closed sit in CLOSE-WAIT";
  EXPECT_GE(metric("kvroute_upstream_connections_reaped_total"), 2);
  // And the next request still goes through, on a fresh connection.
  EXPECT_EQ(http(api_, "POST", "/v1/chat/completions", chat("after", 2, false)).status, 200);
}

TEST_F(Failover, NoHealthyWorkerIsA503WithRetryAfter) {
  start_router({}, {});
  auto r = http(api_, "POST", "/v1/chat/completions", chat("anyone", 2, false));
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_FALSE(r.header("retry-after").empty());
}

}  // namespace
}  // namespace kvroute::test
