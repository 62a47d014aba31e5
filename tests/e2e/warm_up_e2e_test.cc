// kv_cost's warm-ups end to end (router/warm_up.h): kvroute in front of two kvroute-sim workers. One worker holds
// an 8K-token prefix and the prefix's requests keep coming to it while the other idles; their rent buys a copy,
// which the router makes by sending the idle worker the prompt alone. No client request pays for it.
#include <algorithm>
#include <atomic>
#include <random>
#include <thread>

#include <boost/json.hpp>
#include <gtest/gtest.h>

#include "tests/support/harness.h"

namespace kvroute::test {
namespace {

namespace json = boost::json;
using namespace std::chrono_literals;

constexpr int kPrefix = 8192;
constexpr int kOutput = 200;

class TwoWorkers {
 public:
  explicit TwoWorkers(std::vector<std::string> router_args = {}) {
    sim_ = free_ports(2);
    sim_proc_ = Process::start({bin("kvroute-sim"), "--port", std::to_string(sim_), "--workers", "2", "--speed", "20"},
                               testing::TempDir() + "/kvroute-warm-sim.log");
    for (int i = 0; i < 2; ++i) EXPECT_TRUE(wait_http(sim_ + i, "/health", 10s));
    api_ = free_port();
    admin_ = free_port();
    std::vector<std::string> argv{bin("kvroute"), "--listen", "127.0.0.1:" + std::to_string(api_), "--admin-listen",
                                  "127.0.0.1:" + std::to_string(admin_), "--metrics-interval", "0.2"};
    for (int i = 0; i < 2; ++i) argv.insert(argv.end(), {"--worker", "http://127.0.0.1:" + std::to_string(sim_ + i)});
    argv.insert(argv.end(), router_args.begin(), router_args.end());
    router_ = Process::start(argv, testing::TempDir() + "/kvroute-warm-router.log");
    EXPECT_TRUE(wait_http(api_, "/health", 10s));
    std::mt19937_64 rng(11);
    for (int t = 0; t < kPrefix; ++t) prefix_.push_back(static_cast<std::int64_t>(1000 + rng() % 50000));
  }

  // The prefix and a tail of its own (`tail_tokens` of them), for `max_tokens`.
  std::string body(int tail, int max_tokens, int tail_tokens = 32) const {
    json::array prompt = prefix_;
    for (int t = 0; t < tail_tokens; ++t) prompt.push_back(static_cast<std::int64_t>(60000 + tail * 100 + t));
    return json::serialize(json::object{{"model", "qwen3-8b"}, {"prompt", prompt}, {"max_tokens", max_tokens}});
  }

  double router_metric(const std::string& name) const { return metric_sum(http(admin_, "GET", "/metrics").body, name); }
  double worker_metric(int i, const std::string& name) const {
    return metric_sum(http(sim_ + i, "GET", "/metrics").body, name);
  }
  double fleet_metric(const std::string& name) const { return worker_metric(0, name) + worker_metric(1, name); }
  std::string worker(int i) const { return "127.0.0.1:" + std::to_string(sim_ + i); }

  // Requests for the prefix, one every 50 ms, each running on (200 tokens), until `enough` holds or `limit`
  // were sent; all answered in full. Returns how many were sent.
  int load(int limit, const std::function<bool()>& enough) {
    std::vector<std::thread> clients;
    std::atomic<int> ok{0};
    int sent = 0;
    for (; sent < limit && !enough(); ++sent) {
      clients.emplace_back([this, &ok, k = sent + 1] {
        const auto r = http(api_, "POST", "/v1/completions", body(k, kOutput));
        EXPECT_EQ(r.status, 200) << r.body << r.error;
        if (r.status == 200) ++ok;
      });
      std::this_thread::sleep_for(50ms);
    }
    for (auto& c : clients) c.join();
    EXPECT_EQ(ok.load(), sent);
    return sent;
  }

  // Requests the router has in flight on its workers, as /admin/workers reports them.
  int in_flight() const {
    int n = 0;
    const auto workers = json::parse(http(admin_, "GET", "/admin/workers").body);
    for (const auto& w : workers.at("workers").as_array()) n += w.at("in_flight").to_number<int>();
    return n;
  }

  int api() const { return api_; }
  int admin() const { return admin_; }

 private:
  int sim_ = 0, api_ = 0, admin_ = 0;
  json::array prefix_;
  Process sim_proc_, router_;
};

std::uint64_t cached_tokens(const std::string& body) {
  return json::parse(body).at("usage").at("prompt_tokens_details").at("cached_tokens").to_number<std::uint64_t>();
}

TEST(WarmUpE2E, AHotPrefixIsCopiedToTheIdleWorkerOffAnyRequestsPath) {
  TwoWorkers fleet;
  const auto first = http(fleet.api(), "POST", "/v1/completions", fleet.body(0, 4));
  ASSERT_EQ(first.status, 200) << first.body;
  const std::string holder = first.header("x-kvroute-worker");
  const int other = holder == fleet.worker(0) ? 1 : 0;
  const int sent = fleet.load(200, [&] { return fleet.router_metric("kvroute_warm_ups_total{outcome=\"answered\"}") >= 1; });
  const double answered = fleet.router_metric("kvroute_warm_ups_total{outcome=\"answered\"}");
  std::printf("warm-up: %d requests sent before the copy was bought, %g warm-ups\n", sent, answered);
  ASSERT_GE(answered, 1.0);
  EXPECT_EQ(fleet.router_metric("kvroute_warm_ups_total{outcome=\"failed\"}"), 0.0);
  // The workers served every client request and each warm-up, which generated one token and reached no client.
  const int clients = 1 + sent;
  EXPECT_EQ(fleet.fleet_metric("vllm:request_success_total"), clients + answered);
  EXPECT_EQ(fleet.fleet_metric("vllm:generation_tokens_total"), 4 + static_cast<double>(sent) * kOutput + answered);
  EXPECT_GE(fleet.worker_metric(other, "vllm:prompt_tokens_total"), kPrefix);
  // Their load on the workers ended with them.
  for (int k = 0; k < 50 && fleet.in_flight() > 0; ++k) std::this_thread::sleep_for(20ms);
  EXPECT_EQ(fleet.in_flight(), 0);
  // The copy is in the other worker's cache: with the holder cordoned, the next request reads the prefix there.
  const auto c = http(fleet.admin(), "POST", "/admin/workers/" + holder + "/cordon");
  ASSERT_EQ(c.status, 200) << c.body;
  const auto next = http(fleet.api(), "POST", "/v1/completions", fleet.body(9999, 4));
  ASSERT_EQ(next.status, 200) << next.body;
  EXPECT_EQ(next.header("x-kvroute-worker"), fleet.worker(other));
  EXPECT_EQ(cached_tokens(next.body), static_cast<std::uint64_t>(kPrefix));
}

// A session opening whose balance wants the worker without its prefix (the holder has one session bound, the other
// none): its first turn is served by the holder from cache, the session is bound to the other worker, which the
// router warms with the prompt, and the session's next turn goes there and finds the prefix.
TEST(WarmUpE2E, ASessionsFirstTurnIsServedByItsPrefixsHolderAndItsNextTurnFindsThePrefixWhereItIsBound) {
  TwoWorkers fleet;
  const auto first = http(fleet.api(), "POST", "/v1/completions", fleet.body(0, 4), {{"x-session-id", "s1"}});
  ASSERT_EQ(first.status, 200) << first.body;
  const std::string holder = first.header("x-kvroute-worker");
  const std::string other = holder == fleet.worker(0) ? fleet.worker(1) : fleet.worker(0);
  for (int k = 0; k < 50 && fleet.in_flight() > 0; ++k) std::this_thread::sleep_for(20ms);
  const auto opening = http(fleet.api(), "POST", "/v1/completions", fleet.body(1, 4), {{"x-session-id", "s2"}});
  ASSERT_EQ(opening.status, 200) << opening.body;
  EXPECT_EQ(opening.header("x-kvroute-worker"), holder);
  EXPECT_GE(cached_tokens(opening.body), static_cast<std::uint64_t>(kPrefix));
  for (int k = 0; k < 100 && fleet.router_metric("kvroute_warm_ups_total{outcome=\"answered\"}") < 1; ++k)
    std::this_thread::sleep_for(20ms);
  EXPECT_EQ(fleet.router_metric("kvroute_warm_ups_total{outcome=\"answered\"}"), 1.0);
  // The next turn: the same prompt grown by the first turn's exchange.
  const auto next = http(fleet.api(), "POST", "/v1/completions", fleet.body(1, 4, 96), {{"x-session-id", "s2"}});
  ASSERT_EQ(next.status, 200) << next.body;
  EXPECT_EQ(next.header("x-kvroute-worker"), other);
  EXPECT_GE(cached_tokens(next.body), static_cast<std::uint64_t>(kPrefix));
  // The first session stays on the holder.
  const auto again = http(fleet.api(), "POST", "/v1/completions", fleet.body(0, 4, 96), {{"x-session-id", "s1"}});
  EXPECT_EQ(again.header("x-kvroute-worker"), holder);
}

TEST(WarmUpE2E, WithWarmUpsOffNoPromptIsSentBesideTheRequests) {
  TwoWorkers fleet({"--warm-ups", "false"});
  ASSERT_EQ(http(fleet.api(), "POST", "/v1/completions", fleet.body(0, 4)).status, 200);
  const int sent = fleet.load(100, [] { return false; });
  EXPECT_EQ(fleet.router_metric("kvroute_warm_ups_total"), 0.0);
  EXPECT_EQ(fleet.fleet_metric("vllm:request_success_total"), 1.0 + sent);
  EXPECT_EQ(fleet.fleet_metric("vllm:generation_tokens_total"), 4 + static_cast<double>(sent) * kOutput);
}

}  // namespace
}  // namespace kvroute::test
