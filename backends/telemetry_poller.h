// TelemetryPoller: polls every worker's Prometheus /metrics (vLLM and SGLang names, architecture section 9)
// at a fixed interval and stores running, waiting, KV usage and KV capacity in the worker registry, where the
// policies read them and the prefix index takes its per-worker capacity from.
//
//   auto poller = std::make_shared<TelemetryPoller>(ex, registry, 1s, [&](const Worker& w) { ... });
//   poller->start();
//
// A worker whose /metrics cannot be read keeps its last telemetry, marked stale (valid = false) after three
// missed polls; on_update hears of that too, so what is exported as the worker's load can say "unknown".
// Threading: polling state lives on the poller's strand; Worker::set_telemetry takes the worker's lock.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <unordered_map>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>

#include "backends/events/telemetry.h"
#include "backends/worker_registry.h"

namespace kvroute::backends {

// The registry's view of what an engine reported (its /metrics, or a native LoadReport event).
WorkerTelemetry telemetry_from(const events::WorkerTelemetry& t);

class TelemetryPoller : public std::enable_shared_from_this<TelemetryPoller> {
 public:
  using OnUpdate = std::function<void(const Worker&, const WorkerTelemetry&)>;
  TelemetryPoller(boost::asio::any_io_executor ex, WorkerRegistry& registry, std::chrono::milliseconds interval,
                  OnUpdate on_update);
  void start();
  void stop();

 private:
  void tick();
  void poll(std::shared_ptr<Worker> worker);

  boost::asio::strand<boost::asio::any_io_executor> strand_;
  boost::asio::steady_timer timer_;
  WorkerRegistry& registry_;
  std::chrono::milliseconds interval_;
  OnUpdate on_update_;
  bool stopped_ = false;
  std::unordered_map<WorkerId, int> misses_;       // on strand_
  std::unordered_map<WorkerId, bool> in_progress_;  // on strand_
};

}  // namespace kvroute::backends
