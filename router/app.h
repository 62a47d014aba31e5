// App: the assembled daemon (registry, index, policy, upstream pool, health checks, listeners). main() and
// the in-process tests both build one, so what the tests run is what ships.
//
//   boost::asio::io_context io;
//   App app(io, config);
//   if (auto ok = app.start(); !ok) fail(ok.error().message);
//   io.run();
#pragma once

#include <map>
#include <memory>
#include <mutex>

#include <boost/asio/io_context.hpp>

#include "backends/events/kv_event_subscriber.h"
#include "backends/health_checker.h"
#include "backends/telemetry_poller.h"
#include "backends/upstream.h"
#include "backends/worker_registry.h"
#include "router/config.h"
#include "router/http_server.h"
#include "router/metrics.h"
#include "router/router.h"

namespace kvroute::router {

class App {
 public:
  App(boost::asio::io_context& io, Config config);
  Result<bool> start();
  void stop();

  const Config& config() const { return config_; }
  backends::WorkerRegistry& registry() { return registry_; }
  Router& router() { return *router_; }
  boost::asio::ip::tcp::endpoint api_endpoint() const { return api_->local_endpoint(); }
  boost::asio::ip::tcp::endpoint admin_endpoint() const { return admin_->local_endpoint(); }

 private:
  // Precise mode: subscribes to a worker's KV events once its model (the events' namespace) is known.
  void start_events(const backends::Worker& worker);
  void subscribe_events(hashing::WorkerId id, const backends::WorkerEndpoint& ep, const std::string& model);
  void on_stream_liveness(hashing::WorkerId id, bool live, std::string_view reason);

  boost::asio::io_context& io_;
  Config config_;
  backends::WorkerRegistry registry_;
  RouterMetrics metrics_;
  std::unique_ptr<Router> router_;
  std::unique_ptr<backends::UpstreamPool> pool_;
  std::unique_ptr<TokenizeCache> tokenize_cache_;
  std::unique_ptr<Services> services_;
  std::shared_ptr<backends::HealthChecker> health_;
  std::shared_ptr<backends::TelemetryPoller> telemetry_;
  std::shared_ptr<Listener> api_;
  std::shared_ptr<Listener> admin_;
  std::mutex events_mu_;
  std::map<hashing::WorkerId, std::unique_ptr<events::KvEventSubscriber>> subscribers_;  // guarded by events_mu_
  bool stopping_ = false;                                                               // guarded by events_mu_
};

}  // namespace kvroute::router
