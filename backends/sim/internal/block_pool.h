// BlockPool: the paged KV cache of the simulated engine, GPU blocks plus an optional CPU tier.
//
// Modelled on vLLM v1's KV cache manager (vllm/v1/core/block_pool.py, kv_cache_utils.py; the behaviour,
// not the code): a fixed array of GPU blocks, each with a reference count and at most one block hash; a
// map hash -> block for prefix hits; and a free queue in LRU order. Freed blocks are appended at the tail
// and allocation takes the head, evicting the head's hash if it has one. Callers free a request's blocks
// tail first (release() walks them backwards) so the end of a prompt is evicted before its beginning,
// which keeps the shared prefixes that other requests are most likely to hit.
//
// The CPU tier is an LRU set of hashes with its own capacity: a hashed GPU block that is evicted is copied
// there (if it is not there already), and the tier drops its least recently used entry when full.
//
// Every change to the set of hashes on either medium is reported to the EngineSink passed in, so a
// consumer of the events can mirror the cache exactly. All operations are O(blocks touched).
//
//   BlockPool pool(4437, 0);
//   std::vector<BlockId> blocks;
//   pool.allocate(3, blocks, sink, t);          // may evict cached blocks (events: removed GPU, stored CPU)
//   pool.register_hash(blocks[0], h0, {}, req, 0);
//   pool.release(blocks);                        // tail first into the free queue; hashes stay cached
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "backends/sim/engine.h"

namespace kvroute::sim::internal {

using BlockId = std::int32_t;
inline constexpr BlockId kNoBlock = -1;

class BlockPool {
 public:
  BlockPool(std::uint64_t num_gpu_blocks, std::uint64_t num_cpu_blocks);

  std::uint64_t num_gpu_blocks() const { return blocks_.size(); }
  std::uint64_t num_cpu_blocks() const { return cpu_capacity_; }
  // Blocks with no reference (free, possibly still holding a cached hash).
  std::uint64_t num_free() const { return num_free_; }
  std::uint64_t num_gpu_cached() const { return gpu_map_.size(); }
  std::uint64_t num_cpu_cached() const { return cpu_map_.size(); }
  std::uint32_t ref_count(BlockId b) const { return blocks_[b].ref; }

  // The GPU block holding `hash`, or kNoBlock.
  BlockId lookup_gpu(std::uint64_t hash) const;
  bool contains_cpu(std::uint64_t hash) const { return cpu_map_.count(hash) != 0; }
  // Marks a CPU-tier entry most recently used (a hit that is being loaded back).
  void touch_cpu(std::uint64_t hash);

  // Takes a reference on a cached block (a prefix hit); a free block leaves the free queue.
  void acquire(BlockId b);
  // Appends `n` fresh blocks (ref 1, no hash) to `out`, taken from the head of the free queue; cached blocks
  // taken this way lose their hash (and go to the CPU tier). The caller checks num_free() >= n first.
  void allocate(std::uint32_t n, std::vector<BlockId>& out, EngineSink& sink, double t);
  // Drops one reference from each block, walking from the last to the first, so that a request's tail
  // blocks reach the free queue first and are evicted first.
  void release(std::span<const BlockId> blocks);

  // Caches `hash` on block b (which the caller computed). Returns false, changing nothing, if the hash is
  // already cached on another GPU block (two requests computed the same block; vLLM keeps the first).
  // No event is sent: the caller batches the stored runs (see Engine).
  bool register_hash(BlockId b, std::uint64_t hash, std::optional<std::uint64_t> parent, std::uint64_t origin,
                     std::uint32_t index);

  // Drops every hash (GPU and CPU). Returns false if any block is referenced.
  bool clear(EngineSink& sink, double t);

  std::vector<std::uint64_t> gpu_hashes() const;
  std::vector<std::uint64_t> cpu_hashes() const;
  std::uint64_t gpu_evictions() const { return gpu_evictions_; }
  std::uint64_t cpu_evictions() const { return cpu_evictions_; }

  // Test hook: the free queue from head (next evicted) to tail.
  std::vector<BlockId> free_queue() const;

 private:
  struct Block {
    std::uint64_t hash = 0;
    std::uint64_t parent = 0;
    std::uint64_t origin = 0;    // request that computed the block
    std::uint32_t index = 0;     // its index in that request's chain
    std::uint32_t ref = 0;
    BlockId prev = kNoBlock;     // free-queue links (valid while ref == 0)
    BlockId next = kNoBlock;
    bool has_hash = false;
    bool has_parent = false;
  };
  struct CpuEntry {
    std::uint64_t parent = 0;
    std::uint64_t origin = 0;
    std::uint32_t index = 0;
    bool has_parent = false;
    std::list<std::uint64_t>::iterator lru;
  };

  void push_free_tail(BlockId b);
  void unlink_free(BlockId b);
  void evict_to_cpu(const Block& blk, EngineSink& sink, double t);

  std::vector<Block> blocks_;
  BlockId free_head_ = kNoBlock;
  BlockId free_tail_ = kNoBlock;
  std::uint64_t num_free_ = 0;
  std::unordered_map<std::uint64_t, BlockId> gpu_map_;

  std::uint64_t cpu_capacity_ = 0;
  std::unordered_map<std::uint64_t, CpuEntry> cpu_map_;
  std::list<std::uint64_t> cpu_lru_;  // front = least recently used

  std::uint64_t gpu_evictions_ = 0;
  std::uint64_t cpu_evictions_ = 0;
};

}  // namespace kvroute::sim::internal
