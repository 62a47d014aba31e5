// HoldWaiters: requests held for their prefix (Router::prefix_held), waiting to be told when their hold may
// have ended: the earlier request computing the prefix had its first byte or ended, or the worker's KV event
// stored the held block. A held request is then sent at once rather than at its next check.
//
// Waking is one-shot: a waiter is woken once and removed, and the woken request checks prefix_held() again
// (the event may have stored other blocks than the one it waits for, or the earlier request may still be
// computing it for another reason) and waits anew if it is still held. Wake functions run outside the lock,
// on the thread that reported the event; they should only post work to the waiter's own executor.
//
//   HoldWaiters w;
//   auto id = w.add(worker, d.hold_leader, d.hold_block, [] { /* post a re-check */ });
//   w.leader_done(worker, token);            // Router::first_byte / complete of the request computing it
//   w.stored(worker, event_blocks);          // the worker's KV event
//   w.remove(id);                            // the hold ended otherwise (no-op once woken)
//
// Thread-safe. Costs one relaxed atomic load per event while nothing waits.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <span>
#include <vector>

#include "hashing/computing_prefixes.h"
#include "hashing/prefix_index.h"

namespace kvroute::router {

class HoldWaiters {
 public:
  using Id = std::uint64_t;  // 0: none

  Id add(hashing::WorkerId worker, hashing::ComputingPrefixes::Token leader, hashing::BlockHash block,
         std::function<void()> wake);
  void remove(Id id);
  // The request `leader` on `worker` produced its first byte or ended: wakes the requests held for it.
  void leader_done(hashing::WorkerId worker, hashing::ComputingPrefixes::Token leader);
  // The worker's KV event stored `blocks`: wakes the requests held there for one of them.
  void stored(hashing::WorkerId worker, std::span<const hashing::BlockHash> blocks);
  std::size_t size() const { return count_.load(std::memory_order_relaxed); }

 private:
  struct Waiter {
    Id id;
    hashing::WorkerId worker;
    hashing::ComputingPrefixes::Token leader;
    hashing::BlockHash block;
    std::function<void()> wake;
  };
  template <typename Match>
  void wake_if(Match match);

  mutable std::mutex mu_;
  std::vector<Waiter> waiters_;  // guarded by mu_; few (holds are rare and short)
  Id next_ = 1;                  // guarded by mu_
  std::atomic<std::size_t> count_{0};
};

}  // namespace kvroute::router
