#include "router/hold_waiters.h"

#include <algorithm>
#include <utility>

namespace kvroute::router {

HoldWaiters::Id HoldWaiters::add(hashing::WorkerId worker, hashing::ComputingPrefixes::Token leader,
                                 hashing::BlockHash block, std::function<void()> wake) {
  std::lock_guard lock(mu_);
  const Id id = next_++;
  waiters_.push_back({id, worker, leader, block, std::move(wake)});
  count_.store(waiters_.size(), std::memory_order_relaxed);
  return id;
}

void HoldWaiters::remove(Id id) {
  if (id == 0 || size() == 0) return;
  std::lock_guard lock(mu_);
  std::erase_if(waiters_, [id](const Waiter& w) { return w.id == id; });
  count_.store(waiters_.size(), std::memory_order_relaxed);
}

template <typename Match>
void HoldWaiters::wake_if(Match match) {
  std::vector<std::function<void()>> woken;
  {
    std::lock_guard lock(mu_);
    auto keep = std::partition(waiters_.begin(), waiters_.end(), [&](const Waiter& w) { return !match(w); });
    for (auto it = keep; it != waiters_.end(); ++it) woken.push_back(std::move(it->wake));
    waiters_.erase(keep, waiters_.end());
    count_.store(waiters_.size(), std::memory_order_relaxed);
  }
  for (auto& wake : woken) wake();
}

void HoldWaiters::leader_done(hashing::WorkerId worker, hashing::ComputingPrefixes::Token leader) {
  if (leader == 0 || size() == 0) return;
  wake_if([&](const Waiter& w) { return w.worker == worker && w.leader == leader; });
}

void HoldWaiters::stored(hashing::WorkerId worker, std::span<const hashing::BlockHash> blocks) {
  if (size() == 0) return;
  wake_if([&](const Waiter& w) {
    return w.worker == worker && std::find(blocks.begin(), blocks.end(), w.block) != blocks.end();
  });
}

}  // namespace kvroute::router
