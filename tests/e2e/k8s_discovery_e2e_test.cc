// kvroute --discover-k8s end to end: the real binary follows a Service's EndpointSlices served by a fake API
// server (tests/support/fake_k8s_api.h) and routes to two simulated workers on 127.0.0.1 and 127.0.0.2 (one
// port, as the pods of one Service). A worker whose pod terminates gets no new request but stays listed; one
// that leaves the slice is removed.
#include <fstream>
#include <map>
#include <string>
#include <thread>

#include <boost/json.hpp>
#include <gtest/gtest.h>

#include "tests/support/fake_k8s_api.h"
#include "tests/support/harness.h"

namespace kvroute::test {
namespace {

namespace json = boost::json;
using namespace std::chrono_literals;

// The worker entry of /admin/workers named `name`, or null.
json::object worker_entry(int admin, const std::string& name) {
  const auto r = http(admin, "GET", "/admin/workers");
  if (r.status != 200) return {};
  const json::value v = json::parse(r.body);
  const json::array* list = v.is_array() ? &v.get_array() : v.as_object().at("workers").if_array();
  for (const auto& w : list ? *list : json::array{}) {
    if (w.at("name").as_string() == name) return w.as_object();
  }
  return {};
}

template <class F>
bool eventually(F done, std::chrono::milliseconds limit = 10s) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (done()) return true;
    std::this_thread::sleep_for(50ms);
  }
  return done();
}

TEST(K8sDiscoveryE2E, ReadyPodsServeTerminatingOnesDrain) {
  const int port = free_port(), api = free_port(), admin = free_port();
  Process a = Process::start({bin("kvroute-sim"), "--host", "127.0.0.1", "--port", std::to_string(port), "--speed", "50"});
  Process b = Process::start({bin("kvroute-sim"), "--host", "127.0.0.2", "--port", std::to_string(port), "--speed", "50"});
  ASSERT_TRUE(wait_http(port, "/health", 10s));
  FakeK8sApi k8s;
  k8s.put(k8s_slice("vllm-abc", {{"127.0.0.1"}, {"127.0.0.2"}}, port));
  const std::string token = testing::TempDir() + "/kvroute-e2e-k8s-token";
  std::ofstream(token) << "e2e-token\n";
  Process router = Process::start({bin("kvroute"), "--discover-k8s", "llm/vllm:http", "--k8s-api-url", k8s.url(),
                                   "--k8s-token-file", token, "--policy", "round_robin", "--listen",
                                   "127.0.0.1:" + std::to_string(api), "--admin-listen", "127.0.0.1:" + std::to_string(admin)},
                                  testing::TempDir() + "/kvroute-e2e-k8s.log");
  ASSERT_TRUE(wait_http(api, "/health", 10s));
  const std::string one = "127.0.0.1:" + std::to_string(port), two = "127.0.0.2:" + std::to_string(port);
  ASSERT_TRUE(eventually([&] { return !worker_entry(admin, one).empty() && !worker_entry(admin, two).empty(); }));
  EXPECT_EQ(k8s.authorization(), "Bearer e2e-token");
  std::map<std::string, int> served;
  for (int i = 0; i < 8; ++i) {
    auto r = http(api, "POST", "/v1/completions", R"({"model":"qwen3-8b","prompt":"discover","max_tokens":1})");
    EXPECT_EQ(r.status, 200) << r.body << r.error;
    ++served[r.header("x-kvroute-worker")];
  }
  EXPECT_GT(served[one], 0);
  EXPECT_GT(served[two], 0);

  // The second pod terminates: drained (listed, cordoned, shown in the metrics), and no request reaches it.
  k8s.put(k8s_slice("vllm-abc", {{"127.0.0.1"}, {"127.0.0.2", false, true}}, port));
  ASSERT_TRUE(eventually([&] {
    const auto w = worker_entry(admin, two);
    return !w.empty() && w.at("cordoned").as_bool();
  }));
  const std::string metrics = http(admin, "GET", "/metrics").body;
  EXPECT_NE(metrics.find("kvroute_worker_cordoned{worker=\"" + two + "\"} 1"), std::string::npos);
  EXPECT_NE(metrics.find("kvroute_workers_routable 1"), std::string::npos);
  for (int i = 0; i < 6; ++i) {
    auto r = http(api, "POST", "/v1/completions", R"({"model":"qwen3-8b","prompt":"drained","max_tokens":1})");
    EXPECT_EQ(r.status, 200) << r.body << r.error;
    EXPECT_EQ(r.header("x-kvroute-worker"), one);
  }

  // Its pod is gone from the slice: removed.
  k8s.put(k8s_slice("vllm-abc", {{"127.0.0.1"}}, port));
  ASSERT_TRUE(eventually([&] { return worker_entry(admin, two).empty(); }));
  EXPECT_FALSE(worker_entry(admin, one).empty());
  EXPECT_EQ(k8s.lists(), 1);  // every change came through the one watch
}

}  // namespace
}  // namespace kvroute::test
