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
//   auto t = c.begin(w, chain, /*from=*/matched);    // routed: computes chain[matched..]
//   if (auto leader = c.computing(w, m - 1, other[m - 1])) ...   // another request's prefix of m blocks
//   c.end(w, t);                                     // its first token
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

  // A request sent to `worker` computes blocks [from, chain.size()) of `chain`. Returns its token, 0 when it
  // computes no full block.
  Token begin(WorkerId worker, std::span<const BlockHash> chain, std::size_t from);
  // Its first token came, or it ended without one: its blocks are no longer being computed. No-op for 0.
  void end(WorkerId worker, Token token);
  // The earliest registered request on `worker` still computing `block` as block `pos` of its chain (chained
  // hashes: the same block at the same position is the same prefix).
  std::optional<Token> computing(WorkerId worker, std::size_t pos, BlockHash block) const;
  bool active(WorkerId worker, Token token) const;
  // Requests registered on the worker (tests and debugging).
  std::size_t size(WorkerId worker) const;

 private:
  struct Entry {
    Token token;
    std::size_t from;
    std::vector<BlockHash> blocks;  // chain[from..]
  };
  mutable std::mutex mu_;
  std::vector<std::vector<Entry>> workers_;  // by worker id, in registration order; guarded by mu_
  Token next_ = 1;                           // guarded by mu_
};

}  // namespace kvroute::hashing
