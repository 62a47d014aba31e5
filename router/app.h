// App: the assembled daemon (registry, index, policy, upstream pool, health checks, listeners). main() and
// the in-process tests both build one, so what the tests run is what ships.
//
//   boost::asio::io_context io;
//   App app(io, config);
//   if (auto ok = app.start(); !ok) fail(ok.error().message);
//   io.run();
#pragma once

#include <memory>

#include <boost/asio/io_context.hpp>

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
  boost::asio::io_context& io_;
  Config config_;
  backends::WorkerRegistry registry_;
  RouterMetrics metrics_;
  std::unique_ptr<Router> router_;
  std::unique_ptr<backends::UpstreamPool> pool_;
  std::unique_ptr<Services> services_;
  std::shared_ptr<backends::HealthChecker> health_;
  std::shared_ptr<backends::TelemetryPoller> telemetry_;
  std::shared_ptr<Listener> api_;
  std::shared_ptr<Listener> admin_;
};

}  // namespace kvroute::router
