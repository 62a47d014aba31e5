#include "policy/recent_quantile.h"

#include <algorithm>
#include <cmath>

namespace kvroute::policy {
namespace {

// Puts v into `ring`, a window of at most `window` values whose oldest is at `next` once it is full; returns the
// value v replaced, 0 while the window was filling.
double push(std::vector<double>& ring, std::size_t& next, std::size_t window, double v) {
  if (ring.size() < window) {
    ring.push_back(v);
    return 0.0;
  }
  const double replaced = ring[next];
  ring[next] = v;
  next = (next + 1) % window;
  return replaced;
}

}  // namespace

RecentQuantile::RecentQuantile(std::size_t window, double q, std::size_t every, std::size_t min_values)
    : window_(std::max<std::size_t>(window, 1)),
      q_(std::clamp(q, 0.0, 1.0)),
      every_(std::max<std::size_t>(every, 1)),
      min_values_(std::max<std::size_t>(min_values, 1)) {
  ring_.reserve(window_);
}

void RecentQuantile::add(double v) {
  if (!std::isfinite(v)) return;
  std::lock_guard lock(mu_);
  push(ring_, next_, window_, v);
  ++added_;
  if (added_ % every_ != 0 || ring_.size() < min_values_) return;
  scratch_.assign(ring_.begin(), ring_.end());
  const auto k = static_cast<std::size_t>(q_ * static_cast<double>(scratch_.size() - 1));
  std::nth_element(scratch_.begin(), scratch_.begin() + static_cast<std::ptrdiff_t>(k), scratch_.end());
  value_.store(scratch_[k], std::memory_order_relaxed);
}

RecentMean::RecentMean(std::size_t window, std::size_t min_values)
    : window_(std::max<std::size_t>(window, 1)), min_values_(std::max<std::size_t>(min_values, 1)) {
  ring_.reserve(window_);
}

void RecentMean::add(double v) {
  if (!std::isfinite(v)) return;
  std::lock_guard lock(mu_);
  sum_ += v - push(ring_, next_, window_, v);
  if (++added_ % window_ == 0) {
    sum_ = 0;
    for (const double x : ring_) sum_ += x;
  }
  if (ring_.size() >= min_values_) value_.store(sum_ / static_cast<double>(ring_.size()), std::memory_order_relaxed);
}

}  // namespace kvroute::policy
