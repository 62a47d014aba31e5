// KvEventApplier: applies one worker's KV events to the PrefixIndex under kvroute's own block hashes
// (architecture sections 5 and 9; docs/events.md).
//
// vLLM's block hash is seeded per deployment, so the router cannot recompute it. Instead every stored block
// is keyed by kvroute's hash of the block's token ids, chained exactly like hashing::hash_tokens():
//   root      = hashing::namespace_root(lora_name if the event has one else the worker's model, salt)
//               salt: the event's cache_salt (vLLM's first-block extra key) if it has one, else options.salt
//   own[i]    = hashing::hash_block(own[i-1], token ids of block i as little-endian uint32)
//   own[-1]   = the own hash mapped from the event's parent_block_hash, or root when it is nil.
// A map engine hash -> own hash (per data-parallel rank) resolves parents and applies BlockRemoved.
//
// Block sizes: when the engine's block_size B is a multiple of the router's R (16 by default), each engine
// block stands for B/R router blocks, all stored and removed together. Any other B cannot be expressed in the
// router's chain; such events are counted in stats().unsupported_events and not applied (configure the router
// with the engine's block size, or leave that worker in approximate mode).
//
// Tiers: the same block can sit on GPU and on the CPU tier at once (vLLM's offloading stores a CPU copy and
// sends BlockStored with medium "CPU"). Each own hash keeps a holder count per medium; the index sees
// Tier::kGpu while any GPU copy exists, Tier::kCpu while only CPU copies do, and the entry goes away when
// the last copy is removed. Counting holders also keeps a block alive while another rank, or another engine
// hash with the same tokens (different cache_salt, say), still holds it.
//
// Resets: reset_rank() (publisher restart, unrecoverable gap, AllBlocksCleared on that rank) drops the rank's
// blocks; with one rank that is PrefixIndex::clear_worker(). If a rank maps more than
// max_mapped_blocks engine hashes (removals were lost), the rank is reset rather than growing without bound.
//
//   KvEventApplier applier(index, applier_options(/*worker=*/3, "llama-3.1-8b"));
//   applier.apply(batch);          // BlockStored / BlockRemoved / AllBlocksCleared, in order
//
// Thread safety: not thread-safe; one owner thread (the worker's subscriber) calls it. The index it writes is
// itself thread-safe. stats() is a plain copy for that owner to publish.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backends/events/internal/flat_map.h"
#include "backends/events/kv_event.h"
#include "hashing/prefix_index.h"

namespace kvroute::events {

struct ApplierOptions {
  hashing::WorkerId worker = 0;
  std::string model;  // namespace of events without a lora_name
  std::string salt;   // second half of the namespace (tenant / cache_salt); empty by default
  std::uint32_t router_block_tokens = hashing::kDefaultBlockTokens;
  std::uint32_t ranks = 1;                        // data-parallel ranks feeding this worker
  std::int64_t group_idx = 0;                     // the KV cache group applied (hybrid models send several)
  std::size_t max_mapped_blocks = std::size_t{1} << 23;  // per rank
};

struct ApplierStats {
  std::uint64_t batches = 0;
  std::uint64_t events = 0;              // events applied
  std::uint64_t blocks_stored = 0;       // engine blocks stored (re-stores included)
  std::uint64_t blocks_removed = 0;      // engine blocks removed
  std::uint64_t clears = 0;              // AllBlocksCleared applied
  std::uint64_t orphan_events = 0;       // BlockStored whose parent hash is unknown (joined mid-stream)
  std::uint64_t unknown_removals = 0;    // BlockRemoved of a hash never stored (or stored before a reset)
  std::uint64_t unsupported_events = 0;  // other medium, other KV group, or incompatible block size
  std::uint64_t resets = 0;              // reset_rank() calls, overflow resets included
  std::uint64_t overflow_resets = 0;
  std::uint64_t mapped_blocks = 0;       // engine hashes currently mapped, all ranks
};

// Options with the usual defaults (designated initializers that skip members trip -Wextra on GCC 12).
inline ApplierOptions applier_options(hashing::WorkerId worker, std::string model, std::uint32_t ranks = 1,
                                      std::size_t max_mapped_blocks = std::size_t{1} << 23) {
  ApplierOptions o;
  o.worker = worker;
  o.model = std::move(model);
  o.ranks = ranks;
  o.max_mapped_blocks = max_mapped_blocks;
  return o;
}

class KvEventApplier {
 public:
  KvEventApplier(hashing::PrefixIndex& index, ApplierOptions options);
  KvEventApplier(const KvEventApplier&) = delete;
  KvEventApplier& operator=(const KvEventApplier&) = delete;

  // Applies every event of the batch, in order, as coming from data-parallel rank `rank` (< options.ranks;
  // out-of-range ranks are folded onto rank 0).
  void apply(const KvEventBatch& batch, std::uint32_t rank = 0);
  // Forgets everything rank `rank` stored, in the index too.
  void reset_rank(std::uint32_t rank);
  // Forgets every rank (PrefixIndex::clear_worker).
  void reset();

  ApplierStats stats() const;
  const ApplierOptions& options() const { return opt_; }
  // kvroute's own hash for a chain of token ids under this applier's namespace (tests, diagnostics).
  std::uint64_t root_for(const std::string& lora_name);

 private:
  struct EngineBlock {
    std::uint64_t own = 0;   // own hash of the engine block's last router block (the parent of the next)
    std::uint8_t media = 0;  // bit 0: held on GPU, bit 1: held on CPU
  };
  struct OwnRefs {
    std::uint32_t gpu = 0;
    std::uint32_t cpu = 0;
  };
  struct Rank {
    internal::FlatMap64<EngineBlock> blocks;
    // Engine blocks larger than a router block: the own hashes before the last one, in chain order.
    std::unordered_map<std::uint64_t, std::vector<std::uint64_t>> split;
  };

  void apply_stored(const KvEventBatch& batch, const KvEvent& e, Rank& rank, std::uint32_t r);
  void apply_removed(const KvEventBatch& batch, const KvEvent& e, Rank& rank);
  // Adds / drops one holder of `own` on `medium_bit`; queues the index update.
  void add_ref(std::uint64_t own, std::uint8_t medium_bit);
  void drop_ref(std::uint64_t own, std::uint8_t medium_bit);
  void flush();
  // Drop state without counting a reset.
  void drop_rank(std::uint32_t rank);
  void drop_all();

  hashing::PrefixIndex& index_;
  ApplierOptions opt_;
  std::uint64_t model_root_ = 0;
  std::unordered_map<std::string, std::uint64_t> lora_roots_;
  std::vector<Rank> ranks_;
  internal::FlatMap64<OwnRefs> own_;
  ApplierStats stats_;
  // Index updates of the current event, flushed in one call per kind.
  std::vector<hashing::BlockHash> to_gpu_;
  std::vector<hashing::BlockHash> to_cpu_;
  std::vector<hashing::BlockHash> to_remove_;
  std::vector<std::uint64_t> sub_;  // own hashes of one engine block
};

}  // namespace kvroute::events
