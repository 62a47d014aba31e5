// Request smuggling and the admin token end to end (issue 24): kvroute in front of a real kvroute-sim worker,
// driven with raw bytes. What reaches the worker is read from the worker's own count of the requests it served
// (vllm:request_success_total), so a request smuggled past the router would show there.
#include <thread>

#include <gtest/gtest.h>

#include "tests/support/harness.h"

namespace kvroute::test {
namespace {

using namespace std::chrono_literals;

constexpr const char* kToken = "e2e-admin-token";

class GuardedRouter : public ::testing::Test {
 protected:
  void SetUp() override {
    sim_ = free_port();
    sim_proc_ = Process::start({bin("kvroute-sim"), "--port", std::to_string(sim_), "--workers", "1", "--speed", "20"},
                               ::testing::TempDir() + "/kvroute-guard-sim.log");
    ASSERT_TRUE(wait_http(sim_, "/health", 10s));
    api_ = free_port();
    admin_ = free_port();
    router_ = Process::start({bin("kvroute"), "--listen", "127.0.0.1:" + std::to_string(api_), "--admin-listen",
                              "127.0.0.1:" + std::to_string(admin_), "--admin-token", kToken, "--worker",
                              "http://127.0.0.1:" + std::to_string(sim_)},
                             ::testing::TempDir() + "/kvroute-guard-router.log");
    ASSERT_TRUE(wait_http(api_, "/health", 10s));
  }

  double served() const {
    return metric_sum(http(sim_, "GET", "/metrics").body, "vllm:request_success_total");
  }

  int sim_ = 0, api_ = 0, admin_ = 0;
  Process sim_proc_, router_;
};

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Responses in what a connection received, by their heads' ends (an error message may quote "HTTP/1.1", so
// status lines are not counted; the JSON bodies here hold no blank line).
std::size_t responses(const std::string& answer) { return count(answer, "\r\n\r\n"); }

TEST_F(GuardedRouter, SmuggledRequestsNeverReachTheWorker) {
  const std::string body = R"({"model": "qwen3-8b", "messages": [{"role": "user", "content": "SMUGGLED"}]})";
  const std::string smuggled = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                               "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  const std::string head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n";

  // The control: the same request sent plainly is served, and the worker counts it.
  const double before_control = served();
  const std::string ok = raw_exchange(api_, smuggled, 3s);
  ASSERT_EQ(ok.rfind("HTTP/1.1 200", 0), 0u) << ok.substr(0, 200);
  ASSERT_EQ(responses(ok), 1u) << ok;
  EXPECT_EQ(served(), before_control + 1);

  const std::vector<std::string> payloads = {
      head + "Transfer-Encoding: chunked, chunked\r\n\r\n" + smuggled,
      head + "Transfer-Encoding: gzip\r\n\r\n" + smuggled,
      head + "Transfer-Encoding: chunked, gzip\r\n\r\n" + smuggled,
      head + "Transfer-Encoding: gzip\r\nContent-Length: " + std::to_string(smuggled.size()) + "\r\n\r\n" + smuggled,
      "POST /v1/chat/completions HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\nContent-Type: application/json\r\n"
      "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled,
      "POST /v1/chat/completions HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 0\r\n\r\n" + smuggled,
      head + "Host: y\r\nContent-Length: 0\r\n\r\n" + smuggled,
  };
  for (const auto& payload : payloads) {
    SCOPED_TRACE(payload.substr(0, payload.find("\r\n\r\n")));
    const double before = served();
    const std::string answer = raw_exchange(api_, payload, 3s);
    const std::string status = answer.substr(0, answer.find("\r\n"));
    EXPECT_TRUE(status.rfind("HTTP/1.1 4", 0) == 0 || status.rfind("HTTP/1.1 5", 0) == 0) << status;
    EXPECT_NE(answer.find("Connection: close"), std::string::npos) << answer.substr(0, 300);
    EXPECT_EQ(responses(answer), 1u) << "the smuggled request was answered too: " << answer;
    std::this_thread::sleep_for(200ms);
    EXPECT_EQ(served(), before) << "the smuggled request reached the worker";
  }
  EXPECT_EQ(http(api_, "GET", "/health").status, 200);  // and the router keeps serving
}

TEST_F(GuardedRouter, TheAdminApiNeedsTheToken) {
  const std::string worker = R"({"url": "http://127.0.0.1:1"})";
  auto none = http(admin_, "GET", "/admin/workers");
  EXPECT_EQ(none.status, 401);
  EXPECT_EQ(none.header("www-authenticate"), "Bearer");
  EXPECT_EQ(http(admin_, "GET", "/admin/workers", "", {{"Authorization", "Bearer wrong"}}).status, 401);
  EXPECT_EQ(http(admin_, "POST", "/admin/workers", worker).status, 401);
  EXPECT_EQ(http(admin_, "POST", "/admin/workers/0/cordon").status, 401);

  const std::map<std::string, std::string> auth{{"Authorization", std::string("Bearer ") + kToken}};
  auto listed = http(admin_, "GET", "/admin/workers", "", auth);
  EXPECT_EQ(listed.status, 200);
  EXPECT_EQ(count(listed.body, "\"url\""), 1u) << "a worker was added without the token: " << listed.body;
  EXPECT_EQ(http(admin_, "GET", "/admin/status", "", auth).status, 200);
  // Probes and Prometheus need no token.
  EXPECT_EQ(http(admin_, "GET", "/metrics").status, 200);
  EXPECT_EQ(http(admin_, "GET", "/health").status, 200);
}

}  // namespace
}  // namespace kvroute::test
