// RetryBudget: how many requests may be retried on another worker at once, over every I/O thread. A retry
// adds load exactly when the fleet is failing, so retries are capped as Envoy's retry budgets cap them
// (envoy.config.cluster.v3.CircuitBreakers.Thresholds.RetryBudget): at most budget_percent of the active
// requests may be retries under way (Envoy's default 20 %), but never fewer than min_concurrency (Envoy's
// default 3), so a quiet router still retries. Each request also retries at most max_per_request times
// (the caller counts those).
//
// A retry is under way from when it is sent until its worker answers (its response head) or fails it, not for
// the whole response as in Envoy: an LLM response streams for seconds to minutes, and what a budget guards
// against is a burst of attempts on a failing fleet, not the load of a request that one worker now serves.
//
// Thread-safe (one atomic). A Ticket is one retry under way; it gives its place back when destroyed.
//
//   if (auto ticket = budget.try_acquire(active_requests)) { exchange.hold_retry(std::move(*ticket)); ... }
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>

namespace kvroute::router {

class RetryBudget {
 public:
  struct Options {
    int max_per_request = 2;      // retries of one request (Envoy's route retry policy num_retries is 1)
    double budget_percent = 20;   // Envoy retry_budget.budget_percent default
    std::uint32_t min_concurrency = 3;  // Envoy retry_budget.min_retry_concurrency default
  };

  class Ticket {
   public:
    Ticket() = default;
    explicit Ticket(RetryBudget* budget) : budget_(budget) {}
    Ticket(Ticket&& o) noexcept : budget_(std::exchange(o.budget_, nullptr)) {}
    Ticket& operator=(Ticket&& o) noexcept {
      if (this != &o) {
        reset();
        budget_ = std::exchange(o.budget_, nullptr);
      }
      return *this;
    }
    ~Ticket() { reset(); }
    void reset() {
      if (budget_) std::exchange(budget_, nullptr)->active_.fetch_sub(1, std::memory_order_relaxed);
    }
    explicit operator bool() const { return budget_ != nullptr; }

   private:
    RetryBudget* budget_ = nullptr;
  };

  explicit RetryBudget(Options options) : options_(options) {}

  // A retry under way, when fewer than max(min_concurrency, budget_percent of `active_requests`) are.
  std::optional<Ticket> try_acquire(std::size_t active_requests);
  // The most retries that may be under way with `active_requests` requests active.
  std::uint32_t limit(std::size_t active_requests) const;
  std::uint32_t active() const { return active_.load(std::memory_order_relaxed); }
  const Options& options() const { return options_; }

 private:
  const Options options_;
  std::atomic<std::uint32_t> active_{0};
};

}  // namespace kvroute::router
