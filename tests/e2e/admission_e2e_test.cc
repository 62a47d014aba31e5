// Admission control end to end (issue 24): the real kvroute with --max-concurrent-requests in front of a slow
// kvroute-sim worker (real time), driven by concurrent clients over real sockets. Past the queue's bound the
// surplus gets 429 with Retry-After; the queue serves tenants fairly; a wait past --queue-timeout gets 429.
#include <thread>

#include <boost/json.hpp>
#include <gtest/gtest.h>

#include "tests/support/harness.h"

namespace kvroute::test {
namespace {

namespace json = boost::json;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A request the simulated worker takes about `tokens` x 10 ms over (one sequence decoding alone, real time).
std::string slow_body(int tokens) {
  return json::serialize(json::object{{"model", "qwen3-8b"}, {"prompt", "a slow request"}, {"max_tokens", tokens}});
}

class Admission : public ::testing::Test {
 protected:
  void start(std::vector<std::string> flags) {
    sim_ = free_port();
    sim_proc_ = Process::start({bin("kvroute-sim"), "--port", std::to_string(sim_)},
                               ::testing::TempDir() + "/kvroute-admission-sim.log");
    ASSERT_TRUE(wait_http(sim_, "/health", 10s));
    api_ = free_port();
    admin_ = free_port();
    std::vector<std::string> argv = {bin("kvroute"), "--listen", "127.0.0.1:" + std::to_string(api_),
                                     "--admin-listen", "127.0.0.1:" + std::to_string(admin_), "--worker",
                                     "http://127.0.0.1:" + std::to_string(sim_)};
    argv.insert(argv.end(), flags.begin(), flags.end());
    router_ = Process::start(argv, ::testing::TempDir() + "/kvroute-admission-router.log");
    ASSERT_TRUE(wait_http(api_, "/health", 10s));
  }

  double metric(const std::string& name) const { return metric_sum(http(admin_, "GET", "/metrics").body, name); }
  // Waits until the gauge reads `value`.
  bool gauge_reaches(const std::string& name, double value) const {
    for (int i = 0; i < 200; ++i) {
      if (metric(name) == value) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }

  int sim_ = 0, api_ = 0, admin_ = 0;
  Process sim_proc_, router_;
};

TEST_F(Admission, TheSurplusBeyondCapAndQueueGets429WithRetryAfter) {
  start({"--max-concurrent-requests", "1", "--max-queued-requests", "1"});
  constexpr int kClients = 5;
  std::vector<HttpResponse> got(kClients);
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] { got[i] = http(api_, "POST", "/v1/completions", slow_body(150), {}, 20s); });
  }
  for (auto& c : clients) c.join();
  int ok = 0, refused = 0;
  for (const auto& r : got) {
    if (r.status == 200) ++ok;
    if (r.status != 429) continue;
    ++refused;
    EXPECT_EQ(r.header("retry-after"), "1");
    const auto e = json::parse(r.body).at("error");
    EXPECT_EQ(e.at("type").as_string(), "rate_limit_error") << r.body;
    EXPECT_EQ(e.at("code").as_string(), "queue_full") << r.body;
  }
  EXPECT_EQ(ok, 2) << "one served at once and one queued";
  EXPECT_EQ(refused, kClients - 2);
  EXPECT_EQ(metric("kvroute_admission_rejected_total{reason=\"queue_full\"}"), kClients - 2);
  EXPECT_TRUE(gauge_reaches("kvroute_admission_in_flight", 0));
  EXPECT_EQ(metric("kvroute_admission_queued"), 0);
  EXPECT_EQ(http(api_, "POST", "/v1/completions", slow_body(1)).status, 200);  // and it serves again
}

// Tenant a's backlog waits behind its one request in flight; tenant b's single request, sent last, is served
// as soon as a slot frees, before the rest of a's backlog.
TEST_F(Admission, ATenantsBurstDoesNotStarveAnother) {
  start({"--max-concurrent-requests", "1", "--max-queued-requests", "16"});
  std::mutex mu;
  std::vector<std::string> order;  // tenants in the order their responses completed
  // The first request holds the slot about a second, while the others queue behind it.
  auto send = [&](const std::string& tenant, int tokens) {
    const auto r = http(api_, "POST", "/v1/completions", slow_body(tokens), {{"x-tenant-id", tenant}}, 30s);
    EXPECT_EQ(r.status, 200) << r.body << r.error;
    std::lock_guard lock(mu);
    order.push_back(tenant);
  };
  std::vector<std::thread> clients;
  clients.emplace_back(send, "a", 150);
  ASSERT_TRUE(gauge_reaches("kvroute_admission_in_flight", 1));
  for (int i = 1; i <= 3; ++i) {
    clients.emplace_back(send, "a", 30);
    ASSERT_TRUE(gauge_reaches("kvroute_admission_queued", i));
  }
  clients.emplace_back(send, "b", 30);
  ASSERT_TRUE(gauge_reaches("kvroute_admission_queued", 4));
  for (auto& c : clients) c.join();
  ASSERT_EQ(order.size(), 5u);
  EXPECT_EQ(order, (std::vector<std::string>{"a", "b", "a", "a", "a"}));
}

TEST_F(Admission, AWaitPastTheQueueTimeoutGets429) {
  start({"--max-concurrent-requests", "1", "--max-queued-requests", "4", "--queue-timeout", "0.3"});
  std::thread slow([&] { EXPECT_EQ(http(api_, "POST", "/v1/completions", slow_body(200), {}, 20s).status, 200); });
  ASSERT_TRUE(gauge_reaches("kvroute_admission_in_flight", 1));
  const auto t0 = Clock::now();
  const auto r = http(api_, "POST", "/v1/completions", slow_body(1), {}, 10s);
  const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_EQ(r.status, 429) << r.body;
  EXPECT_EQ(r.header("retry-after"), "1");
  EXPECT_NE(r.body.find("queue_timeout"), std::string::npos) << r.body;
  EXPECT_GE(waited, 0.25);
  EXPECT_LT(waited, 1.0);
  slow.join();
  EXPECT_EQ(metric("kvroute_admission_rejected_total{reason=\"queue_timeout\"}"), 1);
}

// A client that disconnects while queued gives its place up at once: the queue does not fill with the dead.
TEST_F(Admission, AClientThatLeavesTheQueueGivesItsPlaceUp) {
  start({"--max-concurrent-requests", "1", "--max-queued-requests", "1"});
  std::thread slow([&] { EXPECT_EQ(http(api_, "POST", "/v1/completions", slow_body(600), {}, 20s).status, 200); });
  ASSERT_TRUE(gauge_reaches("kvroute_admission_in_flight", 1));
  const std::string body = slow_body(1);
  const std::string request = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                              "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  EXPECT_EQ(raw_exchange(api_, request, 300ms), "");  // queued, then the client hangs up
  EXPECT_TRUE(gauge_reaches("kvroute_admission_queued", 0));
  EXPECT_EQ(metric("kvroute_admission_in_flight"), 1) << "the slow request should still hold the slot";
  // Its place is free: the next request waits in it rather than getting 429, and is served.
  EXPECT_EQ(http(api_, "POST", "/v1/completions", body, {}, 20s).status, 200);
  slow.join();
  EXPECT_EQ(metric("kvroute_admission_rejected_total{reason=\"queue_full\"}"), 0);
}

// Without a healthy worker the 503 says when to come back.
TEST(AdmissionE2E, NoHealthyWorkerAnswers503WithRetryAfter) {
  const int api = free_port(), admin = free_port(), dead = free_port();
  Process router = Process::start({bin("kvroute"), "--listen", "127.0.0.1:" + std::to_string(api), "--admin-listen",
                                   "127.0.0.1:" + std::to_string(admin), "--worker",
                                   "http://127.0.0.1:" + std::to_string(dead), "--health-interval", "0.1"},
                                  ::testing::TempDir() + "/kvroute-admission-503.log");
  ASSERT_TRUE(wait_http(api, "/health", 10s));
  HttpResponse r;
  for (int i = 0; i < 50; ++i) {
    r = http(api, "POST", "/v1/completions", slow_body(1));
    if (r.status == 503) break;
    std::this_thread::sleep_for(100ms);
  }
  ASSERT_EQ(r.status, 503) << r.body;
  EXPECT_NE(r.body.find("no_healthy_worker"), std::string::npos) << r.body;
  EXPECT_EQ(r.header("retry-after"), "1");
}

}  // namespace
}  // namespace kvroute::test
