// OutlierDetector: passive outlier detection. A worker whose requests keep failing (refused or reset
// connections, 5xx answers, first-byte timeouts) is ejected: no new request is routed to it for a while,
// though it still passes its health checks. The model is Envoy's outlier detection
// (envoy.config.cluster.v3.OutlierDetection), with its defaults: 5 consecutive failures eject
// (consecutive_5xx), the first ejection lasts 30 s (base_ejection_time), each further one base x the number of
// ejections in a row, at most 300 s (max_ejection_time), and that multiplier decays by one for every 10 s
// (interval) the worker spends back in rotation. Ejections are capped by a percentage of the fleet
// (max_ejection_percent, Envoy's default 10 %; kvroute's default is 50 %, see Options), and, as in Envoy, one
// worker may always be ejected whatever the percentage, except that kvroute never ejects the last worker a
// request could go to: a failing worker still answers, while an empty fleet answers nothing. An ejected worker
// that fails its health checks too counts nothing against the cap: it would be out of rotation anyway.
//
// Thread-safe: success() and failure() come from every I/O thread. The counters are the worker's atomics;
// the decision to eject is taken under one lock, so the cap holds when several workers fail at once.
//
//   OutlierDetector outliers(registry, {}, [](const Worker& w, auto for_) { log(...); });
//   outliers.failure(*worker);   // true: this failure ejected it (Worker::ejected() until ejected_until())
//   outliers.success(*worker);
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>

#include "backends/worker_registry.h"

namespace kvroute::backends {

class OutlierDetector {
 public:
  using Clock = std::chrono::steady_clock;
  struct Options {
    std::uint32_t consecutive_failures = 5;           // Envoy consecutive_5xx
    std::chrono::milliseconds base_ejection{30'000};  // Envoy base_ejection_time
    std::chrono::milliseconds max_ejection{300'000};  // Envoy max_ejection_time
    std::chrono::milliseconds interval{10'000};       // Envoy interval: the multiplier's decay step
    // Envoy's 10 % suits clusters of tens of hosts; an inference fleet is often two to ten workers, where 10 %
    // would mean one ejected worker at a time (Envoy's at-least-one rule): a 503-answering worker and a hung
    // one together would keep one of them in rotation. Half the fleet keeps the other half serving.
    double max_ejection_percent = 50;
  };
  // Called once per ejection, with how long it lasts (under the detector's lock: keep it short).
  using OnEject = std::function<void(const Worker&, Clock::duration)>;

  OutlierDetector(const WorkerRegistry& registry, Options options, OnEject on_eject = {});

  // The worker answered (any status below 500): its run of failures ends.
  void success(Worker& worker);
  // The worker failed a request; returns true when this failure ejected it.
  bool failure(Worker& worker, Clock::time_point now = Clock::now());
  // Workers ejected at `now` (the gauge kvroute_workers_ejected).
  std::size_t ejected_count(Clock::time_point now = Clock::now()) const;
  const Options& options() const { return options_; }

 private:
  bool may_eject(const Worker& worker, Clock::time_point now) const;  // with mu_ held

  const WorkerRegistry& registry_;
  const Options options_;
  OnEject on_eject_;
  std::mutex mu_;  // serializes ejections (the cap), and guards Worker::ejection_multiplier_
};

}  // namespace kvroute::backends
