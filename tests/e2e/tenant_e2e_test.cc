// Tenant isolation end to end (issue 24): kvroute in front of a real kvroute-sim worker that publishes its KV
// events. Two tenants send the same prompt; the second must see no cached token, the router must predict none
// for it, and its precise index must hold each tenant's blocks under that tenant's own namespace.
#include <set>
#include <thread>

#include <boost/json.hpp>
#include <gtest/gtest.h>

#include "tests/support/harness.h"

namespace kvroute::test {
namespace {

namespace json = boost::json;
using namespace std::chrono_literals;

std::set<std::string> hashes(const json::value& v, std::initializer_list<const char*> keys) {
  std::set<std::string> out;
  for (const char* k : keys) {
    for (const auto& h : v.at(k).as_array()) out.insert(std::string(h.as_string()));
  }
  return out;
}

class TenantFleet : public ::testing::Test {
 protected:
  void SetUp() override {
    sim_ = free_port();
    ev_ = free_port();
    replay_ = free_port();
    sim_proc_ = Process::start({bin("kvroute-sim"), "--port", std::to_string(sim_), "--workers", "1", "--speed", "20",
                                "--kv-events-port", std::to_string(ev_), "--kv-events-replay-port",
                                std::to_string(replay_), "--kv-events-format", "vllm"},
                               ::testing::TempDir() + "/kvroute-tenant-sim.log");
    ASSERT_TRUE(wait_http(sim_, "/health", 10s));
    api_ = free_port();
    admin_ = free_port();
    router_ = Process::start(
        {bin("kvroute"), "--listen", "127.0.0.1:" + std::to_string(api_), "--admin-listen",
         "127.0.0.1:" + std::to_string(admin_), "--tenant-salt-secret", "e2e-secret", "--worker",
         "http://127.0.0.1:" + std::to_string(sim_) + ",kv_events=tcp://127.0.0.1:" + std::to_string(ev_) +
             ",replay=tcp://127.0.0.1:" + std::to_string(replay_)},
        ::testing::TempDir() + "/kvroute-tenant-router.log");
    ASSERT_TRUE(wait_http(api_, "/health", 10s));
    for (int k = 0; k < 100; ++k) {
      const auto w = json::parse(http(admin_, "GET", "/admin/workers/0/blocks").body);
      if (w.at("mode").as_string() == "precise") return;
      std::this_thread::sleep_for(50ms);
    }
    FAIL() << "the worker's event stream never went live";
  }

  // One completion of the shared 512-token prompt; returns usage.prompt_tokens_details.cached_tokens.
  std::uint64_t send(const std::string& tenant, const std::string& cache_salt = "") {
    json::array prompt;
    for (int t = 0; t < 512; ++t) prompt.push_back(1000 + (t * 7919) % 30000);
    json::object body{{"model", "qwen3-8b"}, {"prompt", prompt}, {"max_tokens", 1}};
    if (!cache_salt.empty()) body["cache_salt"] = cache_salt;
    const auto r = http(api_, "POST", "/v1/completions", json::serialize(body), {{"x-tenant-id", tenant}});
    EXPECT_EQ(r.status, 200) << r.body << r.error;
    if (r.status != 200) return ~0ull;
    return json::parse(r.body).at("usage").at("prompt_tokens_details").at("cached_tokens").to_number<std::uint64_t>();
  }

  double predicted() const { return metric_sum(http(admin_, "GET", "/metrics").body, "kvroute_predicted_cached_tokens_total"); }

  // Waits until the router's index of the worker equals the blocks the worker holds (its KV events applied).
  bool index_equals_worker() const {
    for (int k = 0; k < 100; ++k) {
      const auto truth = json::parse(http(sim_, "GET", "/debug/kv_blocks").body);
      const auto view = json::parse(http(admin_, "GET", "/admin/workers/0/blocks").body);
      if (hashes(view, {"gpu", "cpu", "predicted"}) == hashes(truth, {"gpu", "cpu"})) return true;
      std::this_thread::sleep_for(50ms);
    }
    return false;
  }

  int sim_ = 0, ev_ = 0, replay_ = 0, api_ = 0, admin_ = 0;
  Process sim_proc_, router_;
};

TEST_F(TenantFleet, ASecondTenantSeesNoCachedTokenOfTheFirst) {
  EXPECT_EQ(send("tenant-a"), 0u);
  ASSERT_TRUE(index_equals_worker());
  // The same tenant again: a hit, predicted by the router from the worker's salted events.
  const double before = predicted();
  EXPECT_GE(send("tenant-a"), 496u);
  EXPECT_GE(predicted() - before, 496.0);
  ASSERT_TRUE(index_equals_worker());

  // Tenant b, the same prompt: nothing cached on the worker, nothing predicted by the router.
  const double before_b = predicted();
  EXPECT_EQ(send("tenant-b"), 0u);
  EXPECT_EQ(predicted() - before_b, 0.0);
  ASSERT_TRUE(index_equals_worker());  // b's blocks sit in b's namespace, beside a's
  EXPECT_GE(send("tenant-b"), 496u);
}

TEST_F(TenantFleet, AClientSaltCannotReachAnotherTenantsNamespace) {
  // Issue 24: tenant "a/s" shared the namespace of tenant "a" sending cache_salt "s". Without
  // --allow-client-cache-salt a client's salt is dropped: (tenant a, salt s) is tenant a's namespace.
  EXPECT_EQ(send("a", "s"), 0u);
  EXPECT_EQ(send("a/s"), 0u);
  EXPECT_GE(send("a"), 496u);
  // No cache_salt a client sends reaches another tenant's cached blocks, nor the shared namespace's.
  EXPECT_EQ(send("b", "s"), 0u);
  EXPECT_EQ(send("", "s"), 0u);
  EXPECT_GE(send(""), 496u);
}

}  // namespace
}  // namespace kvroute::test
