// PrefillQueue: the requests sent to one worker that have not produced their first token yet, each with its
// prefill estimate in seconds (policy::prefill_seconds of its uncached tokens after its cached ones, priced when
// sent), and when the worker last produced a first token. kv_cost prices the queue behind a long prefill from
// it (WorkerView::pending_prefill_s, oldest_prefill_s, prefill_elapsed_s). backends::Worker keeps one per worker
// for the daemon, the fleet simulator one per simulated worker, so both price the same queue.
//
//   PrefillQueue q;
//   q.add(id, prefill_seconds(uncached, cached, P), now);   // sent; ids grow in sending order
//   q.remove(id, /*first_token=*/true, now);                 // its first token (false: it ended without one)
//   q.fill(view, now);
//
// Times are seconds on the caller's clock. Not thread-safe.
#pragma once

#include <cstdint>
#include <map>

#include "policy/routing_policy.h"

namespace kvroute::policy {

class PrefillQueue {
 public:
  void add(std::uint64_t id, double prefill_s, double now);
  // Takes the request out (no-op for an id not queued). A first token also restarts the elapsed time.
  void remove(std::uint64_t id, bool first_token, double now);

  bool empty() const { return entries_.empty(); }
  double total_s() const { return total_s_; }
  double oldest_s() const { return entries_.empty() ? 0.0 : entries_.begin()->second; }
  // When the worker last produced a first token, or when the queue started if later.
  double since() const { return since_; }
  // The view's three fields, left at 0 while the queue is empty.
  void fill(WorkerView& v, double now) const;

 private:
  std::map<std::uint64_t, double> entries_;  // id (sending order) -> estimated prefill seconds
  double total_s_ = 0;
  double since_ = 0;
};

}  // namespace kvroute::policy
