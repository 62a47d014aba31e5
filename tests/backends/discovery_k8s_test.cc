// K8sDiscovery against a small fake Kubernetes API server on a real loopback socket. The fake answers as the
// real one does: LIST with an EndpointSliceList and its resourceVersion; WATCH from a resourceVersion with a
// chunked stream of {"type","object"} lines (ADDED, MODIFIED, DELETED, BOOKMARK), an ERROR event with code 410
// for a version compacted away, a terminating chunk when the watch's time is up.
#include "backends/discovery_k8s.h"

#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/streambuf.hpp>
#include <boost/asio/write.hpp>
#include <boost/json.hpp>
#include <gtest/gtest.h>

namespace kvroute::backends {
namespace {

namespace asio = boost::asio;
namespace json = boost::json;
using asio::ip::tcp;

struct Ep {
  std::string address;
  bool ready = true;
  bool terminating = false;
};

// An EndpointSlice as the EndpointSlice controller writes it: two named ports, conditions on every endpoint.
json::object slice(const std::string& name, const std::vector<Ep>& eps) {
  json::array endpoints;
  for (const auto& e : eps) {
    endpoints.push_back(json::object{{"addresses", json::array{json::string(e.address)}},
                                     {"conditions", json::object{{"ready", e.ready}, {"serving", !e.terminating || e.ready},
                                                                 {"terminating", e.terminating}}},
                                     {"targetRef", json::object{{"kind", "Pod"}, {"name", "vllm-" + e.address}}}});
  }
  return json::object{
      {"kind", "EndpointSlice"},
      {"apiVersion", "discovery.k8s.io/v1"},
      {"metadata", json::object{{"name", name}, {"namespace", "llm"},
                                {"labels", json::object{{"kubernetes.io/service-name", "vllm"}}}}},
      {"addressType", "IPv4"},
      {"endpoints", std::move(endpoints)},
      {"ports", json::array{json::object{{"name", "metrics"}, {"port", 9400}, {"protocol", "TCP"}},
                            json::object{{"name", "http"}, {"port", 8000}, {"protocol", "TCP"}}}}};
}

class FakeApiServer {
 public:
  FakeApiServer() : acceptor_(io_, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)) {
    thread_ = std::thread([this] { accept_loop(); });
  }
  ~FakeApiServer() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    // A blocking accept() does not return when its socket is closed by another thread: wake it with a connection.
    boost::system::error_code ec;
    tcp::socket wake(io_);
    wake.connect(acceptor_.local_endpoint(), ec);
    thread_.join();
    acceptor_.close(ec);
    for (auto& t : handlers_) t.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(acceptor_.local_endpoint().port()); }

  // A change, sent to the open watch (when `deliver`) and seen by every later list.
  void put(json::object s, bool deliver = true) { change(std::move(s), false, deliver); }
  void remove(json::object s) { change(std::move(s), true, true); }
  void bookmark() {
    std::lock_guard lock(mu_);
    ++rv_;
    queue_.push_back(event("BOOKMARK", json::object{{"kind", "EndpointSlice"},
                                                    {"metadata", json::object{{"resourceVersion", std::to_string(rv_)}}}}));
    cv_.notify_all();
  }
  // Every version up to now is compacted: a watch from an older one is answered with ERROR 410.
  void compact() {
    std::lock_guard lock(mu_);
    compacted_ = rv_;
  }
  // The open watch ends as the server ends it when its timeoutSeconds are up, or breaks without a word.
  void end_watch() { command("end"); }
  void break_watch() { command("break"); }

  int lists() const { return lists_.load(); }
  int watches() const { return watches_.load(); }
  std::string authorization() const {
    std::lock_guard lock(mu_);
    return authorization_;
  }
  std::string last_watch_version() const {
    std::lock_guard lock(mu_);
    return last_watch_rv_;
  }

 private:
  static std::string event(const std::string& type, json::object object) {
    return json::serialize(json::object{{"type", type}, {"object", std::move(object)}}) + "\n";
  }
  void change(json::object s, bool deleted, bool deliver) {
    std::lock_guard lock(mu_);
    ++rv_;
    s["metadata"].as_object()["resourceVersion"] = std::to_string(rv_);
    const std::string name(s["metadata"].as_object()["name"].as_string());
    const bool known = slices_.count(name) > 0;
    if (deleted) {
      slices_.erase(name);
    } else {
      slices_[name] = s;
    }
    if (deliver) queue_.push_back(event(deleted ? "DELETED" : known ? "MODIFIED" : "ADDED", std::move(s)));
    cv_.notify_all();
  }
  void command(const std::string& c) {
    std::lock_guard lock(mu_);
    queue_.push_back(c);
    cv_.notify_all();
  }

  void accept_loop() {
    for (;;) {
      tcp::socket socket(io_);
      boost::system::error_code ec;
      acceptor_.accept(socket, ec);
      if (ec) return;
      std::lock_guard lock(mu_);
      if (stopping_) return;
      handlers_.emplace_back([this, s = std::move(socket)]() mutable { serve(std::move(s)); });
    }
  }

  void serve(tcp::socket socket) {
    asio::streambuf buf;
    boost::system::error_code ec;
    asio::read_until(socket, buf, "\r\n\r\n", ec);
    if (ec) return;
    std::string head(asio::buffers_begin(buf.data()), asio::buffers_end(buf.data()));
    const std::string target = head.substr(4, head.find(' ', 4) - 4);
    {
      std::lock_guard lock(mu_);
      const auto a = head.find("Authorization: ");
      authorization_ = a == std::string::npos ? "" : head.substr(a + 15, head.find("\r\n", a) - a - 15);
    }
    const std::string path = "/apis/discovery.k8s.io/v1/namespaces/llm/endpointslices?labelSelector=kubernetes.io%2Fservice-name%3Dvllm";
    if (!target.starts_with(path)) {
      asio::write(socket, asio::buffer(std::string("HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")), ec);
      return;
    }
    if (target.find("watch=1") == std::string::npos) return list(socket);
    watch(socket, target.substr(target.find("resourceVersion=") + 16));
  }

  void list(tcp::socket& socket) {
    ++lists_;
    json::array items;
    std::string rv;
    {
      std::lock_guard lock(mu_);
      for (const auto& [name, s] : slices_) items.push_back(s);
      rv = std::to_string(rv_);
      queue_.clear();  // what a new watch (from this version) must not see again
    }
    const std::string body = json::serialize(json::object{{"kind", "EndpointSliceList"},
                                                          {"apiVersion", "discovery.k8s.io/v1"},
                                                          {"metadata", json::object{{"resourceVersion", rv}}},
                                                          {"items", std::move(items)}});
    const std::string res = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
                            std::to_string(body.size()) + "\r\n\r\n" + body;
    boost::system::error_code ec;
    asio::write(socket, asio::buffer(res), ec);
  }

  void watch(tcp::socket& socket, const std::string& rv) {
    ++watches_;
    boost::system::error_code ec;
    const auto chunk = [&](const std::string& data) {
      std::ostringstream hex;
      hex << std::hex << data.size();
      asio::write(socket, asio::buffer(hex.str() + "\r\n" + data + "\r\n"), ec);
    };
    asio::write(socket, asio::buffer(std::string("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                                 "Transfer-Encoding: chunked\r\n\r\n")), ec);
    std::unique_lock lock(mu_);
    last_watch_rv_ = rv;
    if (std::stoll(rv) < compacted_) {
      const std::string gone = event("ERROR", json::object{{"kind", "Status"}, {"apiVersion", "v1"}, {"status", "Failure"},
                                                           {"message", "too old resource version: " + rv},
                                                           {"reason", "Expired"}, {"code", 410}});
      lock.unlock();
      chunk(gone);
      asio::write(socket, asio::buffer(std::string("0\r\n\r\n")), ec);
      return;
    }
    while (!ec) {
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) break;
      const std::string next = queue_.front();
      queue_.pop_front();
      lock.unlock();
      if (next == "break") return;  // the socket closes without the terminating chunk
      if (next == "end") {
        asio::write(socket, asio::buffer(std::string("0\r\n\r\n")), ec);
        return;
      }
      chunk(next);
      lock.lock();
    }
  }

  asio::io_context io_;
  tcp::acceptor acceptor_;
  std::thread thread_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, json::object> slices_;  // guarded by mu_
  std::deque<std::string> queue_;               // guarded by mu_: events and commands for the open watch
  long long rv_ = 100;                          // guarded by mu_
  long long compacted_ = 0;                     // guarded by mu_
  std::string authorization_;                   // guarded by mu_
  std::string last_watch_rv_;                   // guarded by mu_
  bool stopping_ = false;                       // guarded by mu_
  std::vector<std::thread> handlers_;           // guarded by mu_
  std::atomic<int> lists_{0}, watches_{0};
};

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

  FakeApiServer server_;
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
  server_.put(slice("vllm-abc", {{"10.0.0.1"}, {"10.0.0.2", false}}));
  start();
  // Listed: the ready pod joins on the port named "http" (not the slice's first port), the unready one waits.
  ASSERT_TRUE(eventually([&] { return reg_.find_by_url("http://10.0.0.1:8000") != nullptr; }));
  EXPECT_EQ(registered(reg_), (std::set<std::string>{"http://10.0.0.1:8000", "http://10.0.0.9:8000"}));
  EXPECT_EQ(reg_.find_by_url("http://10.0.0.1:8000")->endpoint().kv_events_endpoint, "tcp://10.0.0.1:5557");
  EXPECT_EQ(server_.authorization(), "Bearer token-1");
  EXPECT_EQ(server_.lists(), 1);

  // Watched: the second pod turns ready, a second slice brings a third.
  ASSERT_TRUE(eventually([&] { return server_.watches() == 1; }));
  server_.put(slice("vllm-abc", {{"10.0.0.1"}, {"10.0.0.2"}}));
  server_.put(slice("vllm-def", {{"10.0.0.3"}}));
  ASSERT_TRUE(eventually([&] { return registered(reg_).size() == 4; }));

  // A pod terminating is drained, not cut: still registered (in-flight requests finish), no new requests.
  const auto first = reg_.find_by_url("http://10.0.0.1:8000");
  server_.put(slice("vllm-abc", {{"10.0.0.1", false, true}, {"10.0.0.2"}}));
  ASSERT_TRUE(eventually([&] { return cordoned(reg_, "http://10.0.0.1:8000"); }));
  EXPECT_FALSE(first->routable());
  EXPECT_FALSE(first->removed());
  // Gone from the slice: removed. A deleted slice takes its endpoints with it.
  server_.put(slice("vllm-abc", {{"10.0.0.2"}}));
  ASSERT_TRUE(eventually([&] { return first->removed(); }));
  server_.remove(slice("vllm-def", {}));
  ASSERT_TRUE(eventually([&] { return !reg_.find_by_url("http://10.0.0.3:8000"); }));
  EXPECT_EQ(registered(reg_), (std::set<std::string>{"http://10.0.0.2:8000", "http://10.0.0.9:8000"}));
  EXPECT_EQ(server_.lists(), 1);  // all of it through the one watch
  EXPECT_EQ(server_.watches(), 1);
}

TEST_F(K8sDiscoveryTest, DrainedWorkerThatTurnsReadyAgainIsUncordoned) {
  server_.put(slice("vllm-abc", {{"10.0.0.1"}}));
  start();
  ASSERT_TRUE(eventually([&] { return server_.watches() == 1 && reg_.find_by_url("http://10.0.0.1:8000"); }));
  server_.put(slice("vllm-abc", {{"10.0.0.1", false}}));  // failing its readiness probe
  ASSERT_TRUE(eventually([&] { return cordoned(reg_, "http://10.0.0.1:8000"); }));
  server_.put(slice("vllm-abc", {{"10.0.0.1"}}));
  ASSERT_TRUE(eventually([&] { return !cordoned(reg_, "http://10.0.0.1:8000"); }));
}

TEST_F(K8sDiscoveryTest, RenewsWatchesFromTheirVersionAndListsAgainOnGone) {
  server_.put(slice("vllm-abc", {{"10.0.0.1"}}));
  start();
  ASSERT_TRUE(eventually([&] { return server_.watches() == 1; }));
  server_.bookmark();
  server_.put(slice("vllm-abc", {{"10.0.0.1"}, {"10.0.0.2"}}));
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
  server_.put(slice("vllm-abc", {{"10.0.0.2"}}));
  ASSERT_TRUE(eventually([&] { return registered(reg_).size() == 1; }));

  // Changes the watch never delivered, then compaction: the next watch gets 410 Gone and the discovery lists
  // again, which brings the missed changes.
  server_.put(slice("vllm-abc", {{"10.0.0.2"}, {"10.0.0.4"}}), /*deliver=*/false);
  server_.put(slice("vllm-xyz", {{"10.0.0.5"}}), /*deliver=*/false);
  server_.compact();
  server_.break_watch();
  ASSERT_TRUE(eventually([&] { return server_.lists() == 2; }));
  ASSERT_TRUE(eventually([&] { return registered(reg_).size() == 3; }));
  EXPECT_TRUE(reg_.find_by_url("http://10.0.0.5:8000"));
}

TEST_F(K8sDiscoveryTest, ReadsTheTokenAgainForEveryRequest) {
  std::ofstream(dir_ / "token") << "token-2";
  server_.put(slice("vllm-abc", {{"10.0.0.1"}}));
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
    FakeApiServer gone;
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
