// RecentQuantile: a quantile of the last `window` values added, recomputed every `every` additions so that
// reading it costs a load. The router and the fleet simulator keep one over the own contexts of sessions' later
// turns (RoutingContext::session_context_tokens, its largest). RecentMean: the mean of the last `window` values,
// for the scales kv_cost weighs its terms with (RoutingContext::fleet_means).
//
//   RecentQuantile largest(kFleetTailWindow, 1.0, 20, 1);
//   largest.add(own_context_tokens);   // each later turn
//   ctx.session_context_tokens = largest.value();
//
// Thread safety: add() and value() may be called concurrently.
#pragma once

#include <atomic>
#include <cstddef>
#include <mutex>
#include <vector>

#include "policy/routing_policy.h"

namespace kvroute::policy {

// The window of the fleet's recent figures: the last 4,000 requests. A window of a few thousand requests spans
// minutes of traffic at the benchmark's loads, so one burst of long prompts does not move it much (a window of
// 1,000 did, for the TTFT tail an earlier kv_cost priced: docs/benchmarks.md, "Tried since").
inline constexpr std::size_t kFleetTailWindow = 4000;

class RecentQuantile {
 public:
  // `q` in [0, 1]; value() stays 0 until `min_values` values were added.
  RecentQuantile(std::size_t window, double q, std::size_t every = 20, std::size_t min_values = 100);

  void add(double v);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  const std::size_t window_;
  const double q_;
  const std::size_t every_;
  const std::size_t min_values_;
  std::mutex mu_;
  std::vector<double> ring_;  // guarded by mu_
  std::vector<double> scratch_;  // guarded by mu_
  std::size_t next_ = 0;         // guarded by mu_: where the next value goes once the ring is full
  std::size_t added_ = 0;        // guarded by mu_
  std::atomic<double> value_{0.0};
};

class RecentMean {
 public:
  // value() stays 0 until `min_values` values were added.
  explicit RecentMean(std::size_t window, std::size_t min_values = 100);

  void add(double v);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  const std::size_t window_;
  const std::size_t min_values_;
  std::mutex mu_;
  std::vector<double> ring_;  // guarded by mu_
  std::size_t next_ = 0;      // guarded by mu_
  std::size_t added_ = 0;     // guarded by mu_
  double sum_ = 0;            // guarded by mu_: of ring_, summed afresh once per window (no drift)
  std::atomic<double> value_{0.0};
};

// How many values a mean of latencies needs before kv_cost weighs with it: latencies spread about as widely as
// their mean (coefficient of variation ~1), so the mean of n has a relative standard error of about 1 / sqrt(n);
// the smallest n that keeps it within 15 %, the median error allowed to kv_cost's own TTFT estimates
// (docs/benchmarks.md, the calibration bound), is ceil(1 / 0.15^2) = 45.
inline constexpr std::size_t kKnownMeanValues = 45;

// The means kv_cost weighs with (RoutingContext::fleet_means), over the last kFleetTailWindow requests.
struct RecentLatencies {
  RecentMean ttft{kFleetTailWindow, kKnownMeanValues}, itl{kFleetTailWindow, kKnownMeanValues},
      e2e{kFleetTailWindow, kKnownMeanValues};
  // A first token, at once: a mean taken at completion would lag the queue by the decode times.
  void first_token(double ttft_s) { ttft.add(ttft_s); }
  // A completed request: its inter-token latency (<= 0: none, a single output token) and end-to-end latency.
  void completed(double itl_s, double e2e_s) {
    if (itl_s > 0) itl.add(itl_s);
    e2e.add(e2e_s);
  }
  RoutingContext::FleetMeans means() const { return {ttft.value(), itl.value(), e2e.value()}; }
};

}  // namespace kvroute::policy
