// K8sDiscovery against a small fake Kubernetes API server on a real loopback socket (tests/support/fake_k8s_api.h),
// which answers list and watch as the real one does.
#include "backends/discovery_k8s.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <mutex>
#include <set>
#include <thread>

#include <boost/asio/io_context.hpp>
#include <boost/json.hpp>
#include <gtest/gtest.h>

#include "tests/support/fake_k8s_api.h"

namespace kvroute::backends {
namespace {

namespace asio = boost::asio;
namespace json = boost::json;
using test::FakeK8sApi;
using test::k8s_slice;

bool eventually(const std::function<bool()>& done, std::chrono::milliseconds limit = std::chrono::seconds(10)) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

std::set<std::string> registered(const WorkerRegistry& reg) {
  std::set<std::string> urls;
  const auto workers = reg.snapshot();
  for (const auto& w : *workers) urls.insert(w->endpoint().url);
  return urls;
}

bool cordoned(const WorkerRegistry& reg, const std::string& url) {
  auto w = reg.find_by_url(url);
  return w && w->cordoned();
}

class K8sDiscoveryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("kvroute-k8s-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    std::ofstream(dir_ / "token") << "token-1\n";
  }
  void TearDown() override {
    if (HasFailure()) {
      std::lock_guard lock(log_mu_);
      for (const auto& m : log_) std::cerr << m << "\n";
    }
    if (discovery_) discovery_->stop();
    io_thread_.reset();  // joins once the discovery's coroutine has ended
    std::filesystem::remove_all(dir_);
  }
  void start() {
    auto api = in_cluster_api({server_.url(), (dir_ / "token").string(), ""});
    ASSERT_TRUE(api) << api.error().message;
    K8sDiscovery::Options o;
    o.min_backoff = std::chrono::milliseconds(20);
    o.max_backoff = std::chrono::milliseconds(100);
    discovery_ = std::make_shared<K8sDiscovery>(io_.get_executor(), reg_, K8sDiscovery::Target{"llm", "vllm", "http", 5557, 0, "m"},
                                                *api, [this](bool warning, const std::string& m) {
                                                  std::lock_guard lock(log_mu_);
                                                  log_.push_back((warning ? "W " : "I ") + m);
                                                });
    discovery_->start();
    io_thread_ = std::make_unique<std::jthread>([this] { io_.run(); });
  }

  FakeK8sApi server_;
  WorkerRegistry reg_;
  asio::io_context io_;
  std::shared_ptr<K8sDiscovery> discovery_;
  std::unique_ptr<std::jthread> io_thread_;
  std::filesystem::path dir_;
  std::mutex log_mu_;
  std::vector<std::string> log_;
};

TEST_F(K8sDiscoveryTest, ReadyJoinTerminatingDrainGoneLeave) {
  ASSERT_TRUE(reg_.add(*parse_worker_url("http://10.0.0.9:8000")));  // configured with --worker: not ours
  server_.put(k8s_slice("vllm-abc", {{"10.0.0.1"}, {"10.0.0.2", false}}));
  start();
  // Listed: the ready pod joins on the port named "http" (not the slice's first port), the unready one waits.
  ASSERT_TRUE(eventually([&] { return reg_.find_by_url("http://10.0.0.1:8000") != nullptr; }));
  EXPECT_EQ(registered(reg_), (std::set<std::string>{"http://10.0.0.1:8000", "http://10.0.0.9:8000"}));
  EXPECT_EQ(reg_.find_by_url("http://10.0.0.1:8000")->endpoint().kv_events_endpoint, "tcp://10.0.0.1:5557");
  EXPECT_EQ(server_.authorization(), "Bearer token-1");
  EXPECT_EQ(server_.lists(), 1);

  // Watched: the second pod turns ready, a second slice brings a third.
  ASSERT_TRUE(eventually([&] { return server_.watches() == 1; }));
  server_.put(k8s_slice("vllm-abc", {{"10.0.0.1"}, {"10.0.0.2"}}));
  server_.put(k8s_slice("vllm-def", {{"10.0.0.3"}}));
  ASSERT_TRUE(eventually([&] { return registered(reg_).size() == 4; }));

  // A pod terminating is drained, not cut: still registered (in-flight requests finish), no new requests.
  const auto first = reg_.find_by_url("http://10.0.0.1:8000");
  server_.put(k8s_slice("vllm-abc", {{"10.0.0.1", false, true}, {"10.0.0.2"}}));
  ASSERT_TRUE(eventually([&] { return cordoned(reg_, "http://10.0.0.1:8000"); }));
  EXPECT_FALSE(first->routable());
  EXPECT_FALSE(first->removed());
  // Gone from the slice: removed. A deleted slice takes its endpoints with it.
  server_.put(k8s_slice("vllm-abc", {{"10.0.0.2"}}));
  ASSERT_TRUE(eventually([&] { return first->removed(); }));
  server_.remove(k8s_slice("vllm-def", {}));
  ASSERT_TRUE(eventually([&] { return !reg_.find_by_url("http://10.0.0.3:8000"); }));
  EXPECT_EQ(registered(reg_), (std::set<std::string>{"http://10.0.0.2:8000", "http://10.0.0.9:8000"}));
  EXPECT_EQ(server_.lists(), 1);  // all of it through the one watch
  EXPECT_EQ(server_.watches(), 1);
}

TEST_F(K8sDiscoveryTest, DrainedWorkerThatTurnsReadyAgainIsUncordoned) {
  server_.put(k8s_slice("vllm-abc", {{"10.0.0.1"}}));
  start();
  ASSERT_TRUE(eventually([&] { return server_.watches() == 1 && reg_.find_by_url("http://10.0.0.1:8000"); }));
  server_.put(k8s_slice("vllm-abc", {{"10.0.0.1", false}}));  // failing its readiness probe
  ASSERT_TRUE(eventually([&] { return cordoned(reg_, "http://10.0.0.1:8000"); }));
  server_.put(k8s_slice("vllm-abc", {{"10.0.0.1"}}));
  ASSERT_TRUE(eventually([&] { return !cordoned(reg_, "http://10.0.0.1:8000"); }));
}

TEST_F(K8sDiscoveryTest, RenewsWatchesFromTheirVersionAndListsAgainOnGone) {
  server_.put(k8s_slice("vllm-abc", {{"10.0.0.1"}}));
  start();
  ASSERT_TRUE(eventually([&] { return server_.watches() == 1; }));
  server_.bookmark();
  server_.put(k8s_slice("vllm-abc", {{"10.0.0.1"}, {"10.0.0.2"}}));
  ASSERT_TRUE(eventually([&] { return registered(reg_).size() == 2; }));

  // The watch's time is up: a new one from the last version seen, no list.
  server_.end_watch();
  ASSERT_TRUE(eventually([&] { return server_.watches() == 2; }));
  EXPECT_EQ(server_.last_watch_version(), "103");  // 101 listed, 102 the bookmark, 103 the change
  EXPECT_EQ(server_.lists(), 1);

  // The connection breaks: after a backoff, the same.
  server_.break_watch();
  ASSERT_TRUE(eventually([&] { return server_.watches() == 3; }));
  EXPECT_EQ(server_.lists(), 1);
  server_.put(k8s_slice("vllm-abc", {{"10.0.0.2"}}));
  ASSERT_TRUE(eventually([&] { return registered(reg_).size() == 1; }));

  // Changes the watch never delivered, then compaction: the next watch gets 410 Gone and the discovery lists
  // again, which brings the missed changes.
  server_.put(k8s_slice("vllm-abc", {{"10.0.0.2"}, {"10.0.0.4"}}), /*deliver=*/false);
  server_.put(k8s_slice("vllm-xyz", {{"10.0.0.5"}}), /*deliver=*/false);
  server_.compact();
  server_.break_watch();
  ASSERT_TRUE(eventually([&] { return server_.lists() == 2; }));
  ASSERT_TRUE(eventually([&] { return registered(reg_).size() == 3; }));
  EXPECT_TRUE(reg_.find_by_url("http://10.0.0.5:8000"));
}

TEST_F(K8sDiscoveryTest, ReadsTheTokenAgainForEveryRequest) {
  std::ofstream(dir_ / "token") << "token-2";
  server_.put(k8s_slice("vllm-abc", {{"10.0.0.1"}}));
  start();
  ASSERT_TRUE(eventually([&] { return server_.watches() == 1; }));
  EXPECT_EQ(server_.authorization(), "Bearer token-2");
  // The token rotates: the next request carries the new one.
  std::ofstream(dir_ / "token") << "token-3";
  server_.end_watch();
  ASSERT_TRUE(eventually([&] { return server_.watches() == 2; }));
  EXPECT_EQ(server_.authorization(), "Bearer token-3");
  EXPECT_EQ(registered(reg_).size(), 1u);
}

TEST(K8sDiscovery, UnreachableApiIsReportedOnceAndRetried) {
  WorkerRegistry reg;
  asio::io_context io;
  std::vector<std::string> log;
  std::mutex mu;
  K8sDiscovery::Options o;
  o.min_backoff = std::chrono::milliseconds(10);
  o.max_backoff = std::chrono::milliseconds(20);
  // A port nothing listens on (the fake's, after it closed).
  std::string url;
  {
    FakeK8sApi gone;
    url = gone.url();
  }
  auto d = std::make_shared<K8sDiscovery>(io.get_executor(), reg, K8sDiscovery::Target{"llm", "vllm", "", 0, 0, ""}, K8sApi{url, "", ""},
                                          [&](bool warning, const std::string& m) {
                                            std::lock_guard lock(mu);
                                            log.push_back((warning ? "W " : "I ") + m);
                                          },
                                          o);
  d->start();
  io.run_for(std::chrono::milliseconds(300));
  d->stop();
  io.run_for(std::chrono::milliseconds(100));
  std::lock_guard lock(mu);
  ASSERT_EQ(log.size(), 1u);
  EXPECT_TRUE(log[0].starts_with("W discover-k8s llm/vllm: list: connect to " + url)) << log[0];
}

// A self-signed certificate for 127.0.0.1 (its own CA), made with the openssl tool; false without it.
bool make_certificate(const std::filesystem::path& dir, const std::string& name) {
  const std::string cmd = "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 -subj /CN=" +
                          name + " -addext subjectAltName=IP:127.0.0.1 -keyout " + (dir / (name + ".key")).string() +
                          " -out " + (dir / (name + ".crt")).string() + " >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0;
}

TEST_F(K8sDiscoveryTest, SpeaksHttpsVerifiedAgainstTheServiceAccountCa) {
  if (!make_certificate(dir_, "api") || !make_certificate(dir_, "other")) GTEST_SKIP() << "no openssl tool";
  FakeK8sApi https((dir_ / "api.crt").string(), (dir_ / "api.key").string());
  https.put(k8s_slice("vllm-abc", {{"10.0.0.1"}}));
  K8sDiscovery::Options o;
  o.min_backoff = std::chrono::milliseconds(20);
  o.max_backoff = std::chrono::milliseconds(50);
  // Verified against the CA that signed the server's certificate: lists, watches, sends the token.
  auto good = std::make_shared<K8sDiscovery>(io_.get_executor(), reg_, K8sDiscovery::Target{"llm", "vllm", "http", 0, 0, ""},
                                             K8sApi{https.url(), (dir_ / "token").string(), (dir_ / "api.crt").string()},
                                             K8sDiscovery::Report{}, o);
  // Against another CA: refused, nothing added, reported.
  WorkerRegistry other_reg;
  std::vector<std::string> other_log;
  std::mutex other_mu;
  auto bad = std::make_shared<K8sDiscovery>(io_.get_executor(), other_reg, K8sDiscovery::Target{"llm", "vllm", "http", 0, 0, ""},
                                            K8sApi{https.url(), (dir_ / "token").string(), (dir_ / "other.crt").string()},
                                            [&](bool, const std::string& m) {
                                              std::lock_guard lock(other_mu);
                                              other_log.push_back(m);
                                            },
                                            o);
  good->start();
  bad->start();
  io_thread_ = std::make_unique<std::jthread>([this] { io_.run(); });
  EXPECT_TRUE(eventually([&] { return reg_.find_by_url("http://10.0.0.1:8000") != nullptr && https.watches() >= 1; }));
  EXPECT_EQ(https.authorization(), "Bearer token-1");
  EXPECT_TRUE(eventually([&] { return https.tls_refused() >= 2; }));  // it keeps trying, with backoff
  EXPECT_EQ(other_reg.snapshot()->size(), 0u);
  good->stop();
  bad->stop();
  io_thread_.reset();
  std::lock_guard lock(other_mu);
  ASSERT_EQ(other_log.size(), 1u);
  EXPECT_NE(other_log[0].find("list: TLS with " + https.url()), std::string::npos) << other_log[0];
}

TEST(EndpointSliceParse, ConditionsAndPortsAsTheApiDefinesThem) {
  // Conditions absent: ready and serving, not terminating. One unnamed port: that one.
  auto s = parse_endpoint_slice(json::parse(R"({"metadata":{"name":"a"},"endpoints":[{"addresses":["10.0.0.1"]},
      {"addresses":[]},{"addresses":["10.0.0.2"],"conditions":{"ready":false,"serving":true,"terminating":true}}],
      "ports":[{"port":8000}]})"), "");
  ASSERT_TRUE(s) << s.error().message;
  EXPECT_EQ(s->port, "8000");
  ASSERT_EQ(s->endpoints.size(), 2u);
  EXPECT_TRUE(s->endpoints[0].ready && s->endpoints[0].serving && !s->endpoints[0].terminating);
  EXPECT_TRUE(!s->endpoints[1].ready && s->endpoints[1].serving && s->endpoints[1].terminating);
  // A port name the slice lacks, or several ports and no name: no port, so no workers from it.
  EXPECT_EQ(parse_endpoint_slice(json::parse(R"({"metadata":{"name":"a"},"ports":[{"name":"http","port":8000}]})"), "grpc")->port, "");
  EXPECT_EQ(parse_endpoint_slice(json::parse(R"({"metadata":{"name":"a"},"ports":[{"port":1},{"port":2}]})"), "")->port, "");
  EXPECT_FALSE(parse_endpoint_slice(json::parse(R"({"endpoints":[]})"), ""));
  EXPECT_FALSE(parse_endpoint_slice(json::parse(R"([1])"), ""));
}

TEST(InClusterApi, FromTheEnvironmentOrTheOverrides) {
  ::unsetenv("KUBERNETES_SERVICE_HOST");
  EXPECT_FALSE(in_cluster_api({}));
  ::setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1", 1);
  ::setenv("KUBERNETES_SERVICE_PORT", "443", 1);
  auto api = in_cluster_api({});
  ASSERT_TRUE(api);
  EXPECT_EQ(api->url, "https://10.96.0.1:443");
  EXPECT_EQ(api->token_file, "/var/run/secrets/kubernetes.io/serviceaccount/token");
  EXPECT_EQ(api->ca_file, "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt");
  EXPECT_EQ(in_cluster_api({"http://127.0.0.1:8001", "/t", "/c"})->token_file, "/t");
  EXPECT_FALSE(in_cluster_api({"ftp://x", "", ""}));
}

}  // namespace
}  // namespace kvroute::backends
