#include "backends/outlier_detector.h"

#include <algorithm>
#include <cmath>

namespace kvroute::backends {

OutlierDetector::OutlierDetector(const WorkerRegistry& registry, Options options, OnEject on_eject)
    : registry_(registry), options_(options), on_eject_(std::move(on_eject)) {}

void OutlierDetector::success(Worker& worker) {
  // A load first: most requests succeed, and a store on every one would bounce the line between threads.
  if (worker.consecutive_failures_.load(std::memory_order_relaxed) != 0) {
    worker.consecutive_failures_.store(0, std::memory_order_relaxed);
  }
}

bool OutlierDetector::failure(Worker& worker, Clock::time_point now) {
  const std::uint32_t run = worker.consecutive_failures_.fetch_add(1, std::memory_order_relaxed) + 1;
  if (options_.consecutive_failures == 0 || run < options_.consecutive_failures) return false;
  std::lock_guard lock(mu_);
  if (worker.removed() || worker.ejected(now) || !may_eject(worker, now)) return false;
  // The multiplier decays by one per interval spent back in rotation since the last ejection ended (Envoy
  // decrements it on each interval sweep that finds the host not ejected).
  if (worker.ejection_multiplier_ > 0 && options_.interval.count() > 0) {
    const auto back_since = std::max(worker.ejected_until(), worker.multiplier_at_);
    const auto steps = static_cast<std::uint32_t>(std::max<Clock::rep>(0, (now - back_since) / options_.interval));
    worker.ejection_multiplier_ -= std::min(worker.ejection_multiplier_, steps);
  }
  ++worker.ejection_multiplier_;
  worker.multiplier_at_ = now;
  const auto base = std::chrono::duration_cast<Clock::duration>(options_.base_ejection);
  const auto cap = std::max(base, std::chrono::duration_cast<Clock::duration>(options_.max_ejection));
  // Envoy: base_ejection_time x the times ejected, capped at max(base_ejection_time, max_ejection_time).
  const auto lasts = std::min<Clock::duration>(base * worker.ejection_multiplier_, cap);
  worker.ejected_until_ns_.store((now + lasts).time_since_epoch().count(), std::memory_order_relaxed);
  worker.ejections_.fetch_add(1, std::memory_order_relaxed);
  worker.consecutive_failures_.store(0, std::memory_order_relaxed);
  if (on_eject_) on_eject_(worker, lasts);
  return true;
}

bool OutlierDetector::may_eject(const Worker& worker, Clock::time_point now) const {
  const auto workers = registry_.snapshot();
  std::size_t ejected = 0, others_routable = 0;
  for (const auto& w : *workers) {
    // Only the ejections that keep a worker out: one failing its health checks as well (a crashed worker
    // whose streams broke) is out of rotation anyway, and must not use up the cap a worker that passes them
    // but fails every request (answers 503 at once, and so draws least-loaded routing) needs.
    if (w->ejected(now) && w->healthy() && !w->cordoned()) ++ejected;
    if (w.get() != &worker && w->healthy() && !w->cordoned() && !w->ejected(now)) ++others_routable;
  }
  // Never the last worker a request could go to.
  if (others_routable == 0) return false;
  // As Envoy: at most max_ejection_percent of the fleet, but always at least one.
  const auto cap = static_cast<std::size_t>(
      std::floor(static_cast<double>(workers->size()) * options_.max_ejection_percent / 100.0));
  return ejected + 1 <= std::max<std::size_t>(1, cap);
}

std::size_t OutlierDetector::ejected_count(Clock::time_point now) const {
  const auto workers = registry_.snapshot();
  return static_cast<std::size_t>(
      std::count_if(workers->begin(), workers->end(), [now](const auto& w) { return w->ejected(now); }));
}

}  // namespace kvroute::backends
