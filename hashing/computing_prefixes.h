// ComputingPrefixes: which blocks each worker is computing right now, for the requests sent to it that have
// not produced their first token yet: a request sent to a worker will compute the blocks of its chain beyond
// what the worker already held (its match there) and, once its first token is out, they are computed.
//
// It answers one question for kv_cost's prefix hold (policy/routing_policy.h, waits_for_computing_prefix()):
// is the last block of a new request's matched prefix on this worker one that an earlier request is still
// computing? Engines that make a step's blocks hits only after the step (SGLang's radix cache) recompute
// that prefix for a request admitted meanwhile; held until the earlier request's first token, or until the
// worker's KV events confirm the block, it reads the prefix instead. The router and kvroute-bench's
// simulation keep it the same way.
//
//   ComputingPrefixes c;
//   auto t = c.begin(w, chain, /*from=*/matched, now);          // routed: computes chain[matched..]
//   if (auto leader = c.leader(w, m - 1, other[m - 1])) ...      // another request's prefix of m blocks
//   c.stored(w, event_blocks, now);                              // the worker's KV event
//   c.first_token(w, t, now);                                    // its first token (c.end(w, t) if none)
//   c.computed_elsewhere(w, last);                               // another replica's request's first token
//
// Holding helps only on engines that make blocks hits after the step that computes them. vLLM v1 makes them
// hits when it schedules them (and its KV events say so then), so a request admitted with the one computing
// its prefix already reads it there. The router tells the two apart from when a one-chunk prefill's blocks
// are stored: it notes when the worker's KV event stores the last block a request computes (stored()), and at
// the request's streamed first token compares. Stored in the first three quarters of the time from dispatch to
// the first token means the worker stores blocks when it schedules them, and holds there stop; stored later,
// or not yet, means after the step (then the event and the first token race, so the margin matters; a long
// queue before the prefill can make a vLLM worker look like the other kind, which only keeps holds allowed
// there). Prefills of 4K-8K tokens decide: one chunk of vLLM's and SGLang's defaults, and long enough to
// outlast the events' delay. Until a worker has shown either, holds are allowed (the cost of one on vLLM is
// bounded by the hold).
//
// Entries live from dispatch to the first token, so at most one per request in prefill. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "hashing/prefix_index.h"

namespace kvroute::hashing {

class ComputingPrefixes {
 public:
  using Token = std::uint64_t;  // 0: nothing registered

  // A request sent to `worker` at `now` (seconds on the caller's clock) computes blocks [from, chain.size()) of
  // `chain`, its prefill expected to start at `starts_at` (the prefill queued ahead of it there done; `now` when
  // nothing is). Returns its token, 0 when it computes no full block.
  Token begin(WorkerId worker, std::span<const BlockHash> chain, std::size_t from, double now = 0,
              double starts_at = -1);
  // Another router replica's request (its routed record, --shared-state): this replica never sees its first
  // token, so the entry ends when the worker's event stores its last block, or kElsewhereTtl seconds after
  // `now` (an entry registered later, of any kind, sweeps it). It teaches no commit timing.
  Token begin_elsewhere(WorkerId worker, std::span<const BlockHash> chain, std::size_t from, double now);
  static constexpr double kElsewhereTtl = 5.0;
  // It ended without a first token (or one that says nothing of its prefill, such as a non-streamed
  // response's): its blocks are no longer being computed. No-op for 0.
  void end(WorkerId worker, Token token);
  // The worker's KV event stored these blocks, at time `now` (seconds on the caller's clock): notes it for
  // the requests in prefill there whose last computed block is among them.
  void stored(WorkerId worker, std::span<const BlockHash> blocks, double now);
  // Its first token came at `now`. Ends it, and from a prefill of one chunk teaches the worker's commit timing.
  // Returns the last block it computed when no KV event has stored that block yet: other router replicas may
  // hold requests for it, and hear of it sooner from this one (SharedState::prefix_computed) than from the
  // event, which on engines that store blocks after the step races the first token.
  std::optional<BlockHash> first_token(WorkerId worker, Token token, double now);
  // Another replica's request computing up to `last` on `worker` had its first token: ends the entries
  // begin_elsewhere() made for it and returns their tokens (the requests held for them may go).
  std::vector<Token> computed_elsewhere(WorkerId worker, BlockHash last);
  // When the worker makes computed blocks hits, as its first tokens and events have shown so far.
  enum class Commit { kUnknown, kAfterStep, kAtSchedule };
  Commit commit(WorkerId worker) const;
  // Whether a hold can help on this worker: not once it has shown that it stores blocks when it schedules
  // them.
  bool holds_help(WorkerId worker) const { return commit(worker) != Commit::kAtSchedule; }
  // Prefills of this many computed blocks teach the commit timing: 4K-8K tokens of 16-token blocks.
  static constexpr std::size_t kTeachMinBlocks = 256, kTeachMaxBlocks = 512;
  // The earliest registered request on `worker` still computing `block` as block `pos` of its chain (chained
  // hashes: the same block at the same position is the same prefix): its token, from which block of its chain it
  // computes, and when its prefill was expected to start (begin(); another replica's request: never known,
  // +infinity).
  struct Computation {
    Token token = 0;
    std::size_t from = 0;
    double starts_at = 0;
  };
  std::optional<Computation> leader(WorkerId worker, std::size_t pos, BlockHash block) const;
  bool active(WorkerId worker, Token token) const;
  // The worker was removed: its entries and what it taught go (its id may be another worker's next).
  void forget(WorkerId worker);
  // Requests registered on the worker (tests and debugging).
  std::size_t size(WorkerId worker) const;

 private:
  struct Entry {
    Token token;
    std::size_t from;
    std::vector<BlockHash> blocks;  // chain[from..]
    double began_at = 0;            // when it was sent
    double starts_at = 0;           // when its prefill was expected to start (begin())
    double stored_at = -1;          // when the worker's event stored blocks.back(); -1: not yet
    bool elsewhere = false;         // another replica's request (begin_elsewhere)
  };
  struct Worker {
    std::vector<Entry> entries;  // in registration order
    int commits_at_schedule = 0;  // evidence: +1 stored by the first token, -1 not yet; kept in [-3, 3]
  };
  // The worker's entry for the token, removed (callers hold mu_); nullopt when there is none. Entries stay in
  // registration order (leader() answers the earliest), so it is erased, not swapped with the last.
  std::optional<Entry> take(WorkerId worker, Token token);

  mutable std::mutex mu_;
  std::vector<Worker> workers_;  // by worker id; guarded by mu_
  Token next_ = 1;                           // guarded by mu_
};

}  // namespace kvroute::hashing
