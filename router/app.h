// App: the assembled daemon (registry, index, policy, upstream pools, health checks, listeners).
//
// Threading is share-nothing on the data path: each I/O thread runs its own io_context with its own API
// listener (SO_REUSEPORT on one port, so the kernel spreads connections) and its own upstream connection
// pool, so a request never hops threads or contends on a scheduler lock. The shared state (registry, index,
// learner, sessions, metrics) has its own small locks. The first context also runs the control plane: the
// admin listener, health checks, telemetry polls.
//
//   std::vector<std::unique_ptr<boost::asio::io_context>> ios = ...;  // one per thread
//   App app(ios, config);
//   if (auto ok = app.start(); !ok) fail(ok.error().message);
//   ... run each io_context on its own thread ...
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "backends/discovery.h"
#include "backends/discovery_k8s.h"
#include "backends/events/kv_event_subscriber.h"
#include "backends/health_checker.h"
#include "backends/telemetry_poller.h"
#include "backends/upstream.h"
#include "backends/worker_registry.h"
#include "router/config.h"
#include "router/listener.h"
#include "router/metrics.h"
#include "router/replica_sync.h"
#include "router/router.h"
#include "router/services.h"

namespace kvroute::router {

class App {
 public:
  App(const std::vector<std::unique_ptr<boost::asio::io_context>>& contexts, Config config);
  Result<bool> start();
  // Graceful shutdown, first step: the API listeners stop accepting, /ready answers 503 and every response
  // closes its connection. Requests in flight go on; stop() once in_flight() is 0 or the drain timeout passed.
  void begin_drain();
  int in_flight() const;
  void stop();

  const Config& config() const { return config_; }
  backends::WorkerRegistry& registry() { return registry_; }
  Router& router() { return *router_; }
  boost::asio::ip::tcp::endpoint api_endpoint() const { return api_.front()->local_endpoint(); }
  boost::asio::ip::tcp::endpoint admin_endpoint() const { return admin_->local_endpoint(); }

 private:
  // start()'s steps, in order.
  Result<std::shared_ptr<const ApiKeys>> load_api_keys() const;
  void watch_registry();
  Result<bool> add_configured_workers();
  void make_services(const std::shared_ptr<const ApiKeys>& api_keys);
  Result<bool> open_listeners();
  void start_health();
  Result<bool> start_discovery();  // DNS and Kubernetes discovery
  // One K8sDiscovery per --discover-k8s Service (an error: the in-cluster API is not there).
  Result<bool> start_k8s_discovery(const backends::K8sDiscovery::Report& report);
  // Precise mode: subscribes to a worker's KV events once its model (the events' namespace) is known.
  void start_events(const backends::Worker& worker);
  void subscribe_events(hashing::WorkerId id, const backends::WorkerEndpoint& ep, const std::string& model);
  void on_stream_liveness(hashing::WorkerId id, bool live, std::string_view reason);
  void describe_events(hashing::WorkerId id, boost::json::object& out);
  // A worker's health changed (active checks, or a failed connection): logs, pools, the healthy gauge.
  void on_health_change(const backends::Worker& w, bool up, const std::string& why);
  // A worker's load report (polled /metrics, or a native LoadReport event): KV capacity and usage.
  void on_telemetry(const backends::Worker& w, const backends::WorkerTelemetry& t);
  // Before /metrics is served: the fleet's size, the shared cache's capacity, cached tokens priced in prefill
  // seconds, the KV event streams' counters.
  void collect_metrics();

  const std::vector<std::unique_ptr<boost::asio::io_context>>& contexts_;
  boost::asio::io_context& io_;  // the control-plane context (contexts_[0])
  Config config_;
  backends::WorkerRegistry registry_;
  RouterMetrics metrics_;
  std::unique_ptr<Router> router_;
  std::vector<std::unique_ptr<backends::UpstreamPool>> pools_;  // one per context
  std::unique_ptr<backends::OutlierDetector> outliers_;
  std::unique_ptr<RetryBudget> retry_budget_;
  std::unique_ptr<TokenizeCache> tokenize_cache_;
  std::vector<std::shared_ptr<DrainState>> drains_;  // one per context (no counter shared between threads)
  std::vector<std::unique_ptr<Services>> services_;             // one per context
  std::shared_ptr<backends::HealthChecker> health_;
  std::shared_ptr<backends::TelemetryPoller> telemetry_;
  std::vector<std::shared_ptr<backends::DnsDiscovery>> discovery_;  // one per --discover name
  std::vector<std::shared_ptr<backends::K8sDiscovery>> k8s_discovery_;  // one per --discover-k8s Service
  std::vector<std::shared_ptr<Listener>> api_;                  // one per context
  std::shared_ptr<Listener> admin_;
  std::mutex events_mu_;
  std::map<hashing::WorkerId, std::unique_ptr<events::KvEventSubscriber>> subscribers_;  // guarded by events_mu_
  bool stopping_ = false;                                                               // guarded by events_mu_
  std::unique_ptr<ReplicaSync> sync_;
  std::shared_ptr<Admission> admission_;  // --max-concurrent-requests; null: no cap  // --shared-state: the other router replicas
};

}  // namespace kvroute::router
