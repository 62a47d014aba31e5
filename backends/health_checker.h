// HealthChecker: active health checks (GET /health) that take a worker out of rotation after
// `unhealthy_threshold` consecutive failures and bring it back after `healthy_threshold` consecutive
// successes. A failure is a connect error, a timeout or a non-2xx status.
//
//   HealthChecker hc(io.get_executor(), registry, {.interval = 2s}, [](const Worker& w, bool up) { log(...); });
//   hc.start();
//
// Threading: all checker state lives on its own strand; Worker::set_healthy is atomic.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>

#include "backends/worker_registry.h"

namespace kvroute::backends {

class HealthChecker : public std::enable_shared_from_this<HealthChecker> {
 public:
  struct Options {
    std::chrono::milliseconds interval{2000};
    std::chrono::milliseconds timeout{1000};
    int unhealthy_threshold = 2;
    int healthy_threshold = 2;
    std::string path = "/health";
  };
  using OnChange = std::function<void(const Worker&, bool healthy)>;

  HealthChecker(boost::asio::any_io_executor ex, WorkerRegistry& registry, Options options, OnChange on_change);
  void start();
  void stop();

 private:
  struct State {
    int failures = 0;
    int successes = 0;
    bool in_progress = false;
  };
  void tick();
  void check(std::shared_ptr<Worker> worker);
  // `ok`: the check passed, failed, or (nullopt) could not be made for want of local resources.
  void on_result(std::shared_ptr<Worker> worker, std::optional<bool> ok);

  boost::asio::strand<boost::asio::any_io_executor> strand_;
  boost::asio::steady_timer timer_;
  WorkerRegistry& registry_;
  Options options_;
  OnChange on_change_;
  bool stopped_ = false;
  std::unordered_map<WorkerId, State> state_;  // on strand_
};

}  // namespace kvroute::backends
