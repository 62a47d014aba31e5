#include "policy/prefill_queue.h"

#include <algorithm>

namespace kvroute::policy {

void PrefillQueue::add(std::uint64_t id, double prefill_s, double now) {
  if (entries_.empty()) since_ = now;
  entries_.emplace(id, prefill_s);
  total_s_ += prefill_s;
}

void PrefillQueue::remove(std::uint64_t id, bool first_token, double now) {
  if (auto it = entries_.find(id); it != entries_.end()) {
    total_s_ -= it->second;
    entries_.erase(it);
  }
  if (entries_.empty()) total_s_ = 0;  // no rounding left over
  if (first_token) since_ = now;
}

void PrefillQueue::fill(WorkerView& v, double now) const {
  if (entries_.empty()) return;
  v.pending_prefill_s = total_s_;
  v.oldest_prefill_s = oldest_s();
  v.prefill_elapsed_s = std::max(0.0, now - since_);
}

}  // namespace kvroute::policy
