// BurstStagger: when requests reach several router replicas at the same instant, the replicas take turns.
//
// A replica learns what the others routed one stream delay late (architecture section 11). Requests that
// arrive at several replicas within that delay are priced on the same view of the fleet, so every replica
// sends its first one to the same cheapest worker, where they queue behind one another's prefill; one router
// would have sent them one after the other, each seeing the ones before it. Arrivals spread evenly over the
// replicas (a Service, a load balancer) make a replica's own arrivals a sample of everyone's:
//
//   k = (replicas - 1) x E[own arrivals within one stream delay d of an own arrival]
//
// is how many of the others' decisions one decision of ours cannot see, on average. Pricing on the same view,
// the k + 1 herd onto one worker, where a request waits for the prefill of those ahead of it: k / 2 of them,
// its place among them being uniform. Its own prefill estimate stands for theirs. Waiting rank x d instead
// (rank: this replica's place among the running replicas) serializes them: the replica of rank r routes after
// the records of ranks 0..r-1 have reached it, so the burst is routed as one router would route it. Wait when
//
//   rank x d < k / 2 x prefill_seconds(prompt)
//
// With arrivals that are far apart (k near 0) or short prompts nothing waits; a trace whose arrivals come in
// whole-second batches (the Mooncake conversation trace: up to 19 at once) waits a few milliseconds on
// prompts whose prefill takes hundreds (docs/benchmarks.md, "Router replicas").
//
//   BurstStagger stagger;
//   const double wait_s = stagger.arrive(now_s, rank, replicas, stream_delay_s, prefill_s);
//   if (wait_s > 0) ... route after wait_s ... else ... route now ...
//
// Not thread-safe: the daemon keeps one under a lock (Router::stagger_s), the simulator one per replica.
#pragma once

#include <cstddef>
#include <deque>

namespace kvroute::policy {

class BurstStagger {
 public:
  // An arrival at `now_s` (seconds, non-decreasing); returns how long to wait before routing it (0: route now).
  // rank in [0, replicas); stream_delay_s: how long a routed record takes to reach the other replicas;
  // prefill_s: the request's own prefill estimate.
  double arrive(double now_s, std::size_t rank, std::size_t replicas, double stream_delay_s, double prefill_s);

  // k above: the others' decisions one of ours is expected not to see (as of the last arrival).
  double concurrent() const { return concurrent_; }

 private:
  std::deque<double> recent_;  // own arrivals within one stream delay of the last
  // The mean, over recent own arrivals, of 2 x the own arrivals in the stream delay before each: a pair of
  // arrivals within d is counted once, by the later, but each of the two misses the other.
  double pairs_ = 0;
  double concurrent_ = 0;
};

}  // namespace kvroute::policy
