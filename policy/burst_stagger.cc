#include "policy/burst_stagger.h"

#include <algorithm>

namespace kvroute::policy {

namespace {
// The mean is taken over roughly the last 64 own arrivals (an exponential average with weight 1/64): enough
// for a few bursts' worth, so a replica knows it is in bursty traffic when the next burst's first request
// comes, and short enough to follow a change of traffic within seconds. A smoothing window, not varied.
constexpr double kWeight = 1.0 / 64.0;
// recent_ holds at most this many arrivals (a flood within one stream delay counts as this many).
constexpr std::size_t kMaxRecent = 4096;
}  // namespace

double BurstStagger::arrive(double now_s, std::size_t rank, std::size_t replicas, double stream_delay_s,
                            double prefill_s) {
  const double d = std::max(stream_delay_s, 0.0);
  while (!recent_.empty() && (recent_.front() < now_s - d || recent_.size() >= kMaxRecent)) recent_.pop_front();
  const double before = static_cast<double>(recent_.size());
  recent_.push_back(now_s);
  pairs_ += kWeight * (2.0 * before - pairs_);
  concurrent_ = replicas > 1 ? static_cast<double>(replicas - 1) * pairs_ : 0.0;
  if (replicas <= 1 || rank == 0 || !(d > 0) || !(prefill_s > 0)) return 0.0;
  const double wait = static_cast<double>(std::min(rank, replicas - 1)) * d;
  return wait < concurrent_ / 2.0 * prefill_s ? wait : 0.0;
}

}  // namespace kvroute::policy
