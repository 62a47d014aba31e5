// PrefixIndex: which workers hold which blocks of a prompt's block chain (architecture section 5).
//
// Every (block hash, worker) pair the router knows about is one 24-byte entry; the entries of one block form
// a short list reached through an open-addressing table, and the entries of one worker form that worker's
// LRU list. match() answers, per worker, how many leading blocks of a chain it holds (and how many of those
// sit on its CPU tier); it stops at the first block that no worker continues.
//
// Each table slot also keeps a 64-bit summary of the block's holders (bit w % 64 for every holder w). While
// every worker id is below 64 and no entry sits on a CPU tier the summary is exact, and match() runs on it
// alone: one probe and a few bit operations per block, however many workers share the block (a system
// prompt held by the whole fleet). Otherwise match() walks the block's entry list.
//
// Two ways to fill it:
//  * approximate mode: record() says "this worker is about to hold this chain"; the chain is touched with its
//    first block most recent (engines evict a finished request's tail first) and the worker's least recently
//    used entries beyond its capacity are evicted, modelling the engine's own LRU;
//  * precise mode: store() / remove() / clear_worker() apply the worker's own KV events; nothing is evicted
//    by capacity since the worker reports its evictions itself.
//
//   PrefixIndex index;
//   index.set_capacity(w, 3'400'000 / 16);
//   index.record(w, chain.hashes);
//   PrefixIndex::Match m;
//   index.match(chain.hashes, m);   // m.blocks[w] == chain.hashes.size()
//
// Thread safety: all methods may be called concurrently; match() and the read accessors share a lock, writers
// take it exclusively.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <span>
#include <vector>

#include "hashing/block_chain.h"

namespace kvroute::hashing {

using WorkerId = std::uint16_t;

enum class Tier : std::uint8_t { kGpu = 0, kCpu = 1, kPredicted = 2 };

class PrefixIndex {
 public:
  // Per-worker result of match(), indexed by WorkerId (dense; workers never seen have 0).
  struct Match {
    std::vector<std::uint32_t> blocks;      // leading blocks of the chain the worker holds
    std::vector<std::uint32_t> cpu_blocks;  // of those, blocks held on the CPU tier
    std::uint32_t longest = 0;              // max over blocks
    std::uint32_t of(WorkerId w) const { return w < blocks.size() ? blocks[w] : 0; }
    std::uint32_t cpu_of(WorkerId w) const { return w < cpu_blocks.size() ? cpu_blocks[w] : 0; }
  };

  PrefixIndex();
  PrefixIndex(const PrefixIndex&) = delete;
  PrefixIndex& operator=(const PrefixIndex&) = delete;

  // Capacity in blocks used by record(); 0 means unlimited.
  void set_capacity(WorkerId worker, std::uint64_t blocks);
  // Approximate mode: set_capacity, and evict the least recently used entries beyond it now rather than at the
  // worker's next record(). A replica that replayed the others' routing before it knew the worker's capacity
  // (it learns it from the worker's metrics) would otherwise believe the worker holds prefixes it evicted long
  // ago until it next routes there. Returns blocks evicted. (With an LRU, evicting late leaves the same blocks
  // as evicting as they came.)
  std::size_t limit(WorkerId worker, std::uint64_t blocks);
  std::uint64_t capacity(WorkerId worker) const;

  // Approximate mode: the worker now holds `chain` (tier kPredicted unless told; a block the worker's events
  // confirmed keeps its tier, so a worker back in precise mode keeps it after drop_tier). Returns blocks evicted.
  std::size_t record(WorkerId worker, std::span<const BlockHash> chain, Tier tier = Tier::kPredicted);

  // Precise mode: apply a worker's own events. store() inserts or moves blocks to `tier` and marks them
  // most recently used, in the order given.
  void store(WorkerId worker, std::span<const BlockHash> blocks, Tier tier);
  // Called after each store() with its worker and blocks, outside the index's lock (the router notes when
  // the blocks of requests in prefill are stored: hashing/computing_prefixes.h). Set it before events flow.
  using StoreListener = std::function<void(WorkerId, std::span<const BlockHash>)>;
  void set_store_listener(StoreListener listener) { store_listener_ = std::move(listener); }
  // Precise mode, at routing time: blocks of `chain` the worker is not known to hold are added on the
  // kPredicted tier; entries it already has keep their tier and count as touched again (the request reads
  // them). The worker's events then confirm the new ones (store() moves them to their real tier) or the router
  // drops them with drop_unconfirmed() when the request ends.
  void expect(WorkerId worker, std::span<const BlockHash> chain);
  // Removes the blocks of `chain` that are still only predicted for this worker. Returns how many.
  std::size_t drop_unconfirmed(WorkerId worker, std::span<const BlockHash> chain);
  // Removes the listed blocks of this worker; unknown blocks are ignored. Returns how many were removed.
  std::size_t remove(WorkerId worker, std::span<const BlockHash> blocks);
  // Drops every entry of the worker (publisher restart, AllBlocksCleared, worker removed).
  void clear_worker(WorkerId worker);
  // Drops the worker's entries on one tier (e.g. the predictions made while its event stream was down).
  std::size_t drop_tier(WorkerId worker, Tier tier);

  void match(std::span<const BlockHash> chain, Match& out) const;

  std::size_t worker_blocks(WorkerId worker) const;
  // Blocks of this worker that have been touched again since they were first stored (used to price
  // evictions): recorded or expected again, or stored again (in precise mode, a block expect() predicted and the
  // worker's event then confirmed counts).
  std::size_t worker_reused_blocks(WorkerId worker) const;
  // worker_reused_blocks() and capacity() of every worker id below reused.size(), under one lock (the
  // routing hot path); `capacity` is resized to match.
  void worker_stats(std::vector<std::uint64_t>& reused, std::vector<std::uint64_t>& capacity) const;
  // The worker's block hashes, most recently used first (debugging and tests).
  std::vector<BlockHash> worker_hashes(WorkerId worker) const;
  // The worker's entries with their tiers, most recently used first.
  std::vector<std::pair<BlockHash, Tier>> worker_entries(WorkerId worker) const;
  bool holds(WorkerId worker, BlockHash block) const;
  // kvroute-bench's simulation of precise mode: touches the routed chain as record() does (its first block
  // most recently used). Blocks from `predicted_from` on (those the request computes) become predicted until
  // the worker's events store them, as expect() makes them in the daemon; earlier blocks keep a predicted
  // mark they have (another request is computing them), and are otherwise on the GPU tier.
  void record_routed(WorkerId worker, std::span<const BlockHash> chain, std::size_t predicted_from);
  // The tier of the worker's entry for the block; nullopt when it has none.
  std::optional<Tier> tier(WorkerId worker, BlockHash block) const;

  std::size_t entries() const;
  std::size_t distinct_blocks() const;
  // Bytes held by the entry pool and the block table (capacity, not just size).
  std::size_t memory_bytes() const;

 private:
  static constexpr std::uint32_t kNil = 0xffffffffu;

  // 20 bytes. An entry names its block by the block's slot in the table (the slot holds the hash), which the
  // table keeps up to date when a block's slot moves (grow_table, erase_slot); the hash itself took 8 bytes more.
  struct Entry {
    std::uint32_t slot;           // the block's slot in slots_
    std::uint32_t next_in_block;  // next entry of the same block (another worker), or kNil
    std::uint32_t lru_prev;       // towards the most recently used end
    std::uint32_t lru_next;       // towards the least recently used end
    WorkerId worker;
    Tier tier;
    std::uint8_t hits;  // saturating count of touches after the first
  };
  static_assert(sizeof(Entry) == 20);

  struct WorkerLru {
    std::uint32_t head = kNil;  // most recently used
    std::uint32_t tail = kNil;  // least recently used
    std::uint64_t count = 0;
    std::uint64_t reused = 0;
    std::uint64_t capacity = 0;
  };

  // One slot of the block table, 20 bytes with 4-byte alignment so that a probe usually reads one cache line
  // (the 64-bit fields are split in halves to avoid padding).
  struct Slot {
    std::uint32_t key_half[2];      // the block hash
    std::uint32_t holders_half[2];  // bit (w % 64) set for every worker w holding the block
    std::uint32_t head;             // first entry of the block, kNil = empty slot
    BlockHash key() const { return key_half[0] | (std::uint64_t{key_half[1]} << 32); }
    void set_key(BlockHash h) { key_half[0] = static_cast<std::uint32_t>(h); key_half[1] = static_cast<std::uint32_t>(h >> 32); }
    std::uint64_t holders() const { return holders_half[0] | (std::uint64_t{holders_half[1]} << 32); }
    void set_holders(std::uint64_t m) { holders_half[0] = static_cast<std::uint32_t>(m); holders_half[1] = static_cast<std::uint32_t>(m >> 32); }
  };
  static_assert(sizeof(Slot) == 20);
  static constexpr std::size_t kNoSlot = ~std::size_t{0};
  static std::uint64_t holder_bit(WorkerId w) { return std::uint64_t{1} << (w & 63); }

  // --- block table (callers hold mu_) ---
  std::size_t slot_of(BlockHash h) const;
  std::size_t next_slot(std::size_t i) const { return i + 1 == slot_count_ ? 0 : i + 1; }
  void point_entries_at(std::size_t i);  // the entries of the block in slot i name slot i
  std::size_t find_slot(BlockHash h) const;  // kNoSlot when absent
  std::size_t insert_slot(BlockHash h);      // existing or new slot (kNil head when new); may grow the table
  void erase_slot(std::size_t i);
  void grow_table();
  void match_by_holders(std::span<const BlockHash> chain, Match& out) const;
  void match_by_entries(std::span<const BlockHash> chain, Match& out) const;

  // --- entries ---
  BlockHash hash_of(std::uint32_t e) const { return slots_[entries_[e].slot].key(); }
  WorkerLru& lru(WorkerId w);
  std::uint32_t find_entry(WorkerId w, BlockHash h) const;
  std::uint32_t find_entry_to_front(WorkerId w, BlockHash h);
  std::uint32_t alloc_entry();
  void lru_unlink(WorkerLru& l, std::uint32_t e);
  void lru_push_front(WorkerLru& l, std::uint32_t e);
  // Inserts or touches (worker, h); returns the entry.
  std::uint32_t touch(WorkerId w, BlockHash h, Tier tier, bool keep_predicted = false);
  void erase_entry(std::uint32_t e);
  std::size_t evict_beyond_capacity(WorkerLru& l);  // the worker's LRU tail beyond its capacity; returns blocks

  // Entries live in fixed-size chunks so the pool grows without copying and with little slack.
  class EntryPool {
   public:
    static constexpr int kChunkBits = 12;
    Entry& operator[](std::uint32_t e) { return chunks_[e >> kChunkBits][e & ((1u << kChunkBits) - 1)]; }
    const Entry& operator[](std::uint32_t e) const {
      return chunks_[e >> kChunkBits][e & ((1u << kChunkBits) - 1)];
    }
    std::uint32_t size() const { return size_; }
    std::uint32_t push_back();
    std::size_t memory_bytes() const;

   private:
    std::vector<std::unique_ptr<Entry[]>> chunks_;
    std::uint32_t size_ = 0;
  };

  mutable std::shared_mutex mu_;
  EntryPool entries_;                           // guarded by mu_
  std::uint32_t free_head_ = kNil;              // free list through next_in_block; guarded by mu_
  std::size_t live_entries_ = 0;                // guarded by mu_
  std::vector<Slot> slots_;                     // block table; guarded by mu_
  std::size_t slot_count_ = 0;                  // slots_.size(), kept (a 20-byte stride makes size() a division)
  std::size_t cpu_entries_ = 0;                 // entries on a CPU tier; guarded by mu_
  std::size_t used_slots_ = 0;                  // guarded by mu_
  std::vector<WorkerLru> workers_;              // guarded by mu_
  StoreListener store_listener_;                // set once, before concurrent use
};

}  // namespace kvroute::hashing
