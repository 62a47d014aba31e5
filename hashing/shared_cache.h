// SharedCache: what one LRU cache holding the whole fleet's KV capacity would have served, measured online on
// the prompts the router sees. It is the benchmark's capacity bound (docs/benchmarks.md) for live traffic:
// a fleet whose workers report fewer cached tokens than this is losing hits to how requests are spread
// (the same prefix recomputed on several workers, copies evicting each other), not to its capacity.
//
// The model: one LRU of block hashes, a request's chain touched tail first (an engine frees a finished
// request's tail first), as the approximate-mode index models one worker. Because every chain holding block
// k also holds block k-1 and touches it later, the blocks of a chain this cache holds always form a leading
// run: the hit is that run's length.
//
// Sampling bounds its memory and the work per request (SHARDS, Waldspurger et al., FAST '15): only blocks
// whose hash falls in a 1/R slice are kept, in a cache of capacity / R. R is the smallest power of two that
// keeps the cache within `max_entries`, but at most 8: exact (R = 1) up to 65,536 blocks, 1/4 for eight H100
// workers of Qwen3-8B (24K blocks each), 1/8 from 11 of them on. An 8K-token prompt touches 513 / R blocks
// (docs/overhead.md). With R > 1 the leading run ends between the last sampled block held and the next
// sampled block, and the estimate is the middle of that gap. A run with no sampled block counts 0, which is
// why R stops at 8: a 512-token system prompt every request shares (32 blocks) then has a (7/8)^32 = 1.4 %
// chance to go uncounted, and at 1/32 the conversation trace's did (its capacity bound came out at 10.7 %
// instead of 14.5 %). At 1/4 and 1/8 both Mooncake traces' capacity bounds come out within 1.4 % of exact.
//
//   SharedCache shared;
//   shared.set_capacity(8 * 24'000);                 // blocks of the whole fleet
//   std::uint64_t hit = shared.access(chain.hashes);  // leading blocks it would have served, then recorded
//
// Thread safety: all methods may be called concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <vector>

#include "hashing/prefix_index.h"

namespace kvroute::hashing {

class SharedCache {
 public:
  static constexpr std::uint64_t kDefaultMaxEntries = 1u << 16;
  static constexpr int kMaxRateBits = 3;  // R <= 8 (see above)

  explicit SharedCache(std::uint64_t max_entries = kDefaultMaxEntries);

  // The fleet's capacity in blocks; returns whether it changed. A change of the sampling rate empties the
  // cache (the blocks kept under one rate say nothing under another); other changes keep it, evicting down to
  // the new capacity.
  bool set_capacity(std::uint64_t blocks);
  std::uint64_t capacity() const;
  // 1 / R: the share of blocks kept.
  double sample_rate() const;

  // Leading blocks of `chain` the shared cache held before this request (estimated when sampling), then
  // records the chain. 0 while the capacity is unknown (0).
  std::uint64_t access(std::span<const BlockHash> chain);

  std::size_t entries() const;
  std::size_t memory_bytes() const;

 private:
  bool sampled(BlockHash h) const;

  const std::uint64_t max_entries_;
  mutable std::mutex mu_;
  std::uint64_t capacity_ = 0;              // guarded by mu_
  int rate_bits_ = 0;                       // R = 2^rate_bits_; guarded by mu_
  PrefixIndex lru_;                         // worker 0 is the shared cache; access() holds mu_ over match + record
  PrefixIndex::Match match_;                // guarded by mu_
  std::vector<BlockHash> kept_;             // the sampled blocks of the chain being accessed; guarded by mu_
  std::vector<std::uint32_t> positions_;    // their positions in the chain; guarded by mu_
};

}  // namespace kvroute::hashing
