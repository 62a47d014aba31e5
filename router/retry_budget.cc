#include "router/retry_budget.h"

#include <algorithm>
#include <cmath>

namespace kvroute::router {

std::uint32_t RetryBudget::limit(std::size_t active_requests) const {
  const auto share = static_cast<std::uint32_t>(
      std::floor(static_cast<double>(active_requests) * options_.budget_percent / 100.0));
  return std::max(options_.min_concurrency, share);
}

std::optional<RetryBudget::Ticket> RetryBudget::try_acquire(std::size_t active_requests) {
  const std::uint32_t cap = limit(active_requests);
  std::uint32_t now = active_.load(std::memory_order_relaxed);
  do {
    if (now >= cap) return std::nullopt;
  } while (!active_.compare_exchange_weak(now, now + 1, std::memory_order_relaxed));
  return Ticket(this);
}

}  // namespace kvroute::router
