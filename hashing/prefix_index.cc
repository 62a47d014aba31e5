#include "hashing/prefix_index.h"

#include <algorithm>
#include <mutex>

namespace kvroute::hashing {

namespace {
constexpr int kInitialBits = 10;
// Maximum load of the block table before it doubles (linear probing stays short below this).
constexpr double kMaxLoad = 0.75;
}  // namespace

PrefixIndex::PrefixIndex() {
  table_bits_ = kInitialBits;
  keys_.assign(std::size_t{1} << table_bits_, 0);
  heads_.assign(std::size_t{1} << table_bits_, kNil);
}

// ---------------------------------------------------------------------------------------------------------
// Block table: linear probing with backward-shift deletion, keyed by the block hash. The hash is already
// well mixed (XXH3), but callers may feed small integers (tests, traces), so it is multiplied once more.

std::size_t PrefixIndex::slot_of(BlockHash h) const {
  return static_cast<std::size_t>((h * 0x9E3779B97F4A7C15ull) >> (64 - table_bits_));
}

const std::uint32_t* PrefixIndex::find_head(BlockHash h) const {
  const std::size_t mask = keys_.size() - 1;
  for (std::size_t i = slot_of(h);; i = (i + 1) & mask) {
    if (heads_[i] == kNil) return nullptr;
    if (keys_[i] == h) return &heads_[i];
  }
}

std::uint32_t* PrefixIndex::find_head(BlockHash h) {
  return const_cast<std::uint32_t*>(static_cast<const PrefixIndex*>(this)->find_head(h));
}

std::uint32_t& PrefixIndex::insert_head(BlockHash h) {
  if (static_cast<double>(used_slots_ + 1) > kMaxLoad * static_cast<double>(keys_.size())) grow_table();
  const std::size_t mask = keys_.size() - 1;
  for (std::size_t i = slot_of(h);; i = (i + 1) & mask) {
    if (heads_[i] == kNil) {
      keys_[i] = h;
      ++used_slots_;
      return heads_[i];  // still kNil: the caller links the first entry
    }
    if (keys_[i] == h) return heads_[i];
  }
}

void PrefixIndex::erase_slot(BlockHash h) {
  const std::size_t mask = keys_.size() - 1;
  std::size_t i = slot_of(h);
  while (true) {
    if (heads_[i] == kNil) return;
    if (keys_[i] == h) break;
    i = (i + 1) & mask;
  }
  heads_[i] = kNil;
  --used_slots_;
  // Shift later members of the probe run back so lookups never stop early at the hole.
  for (std::size_t j = (i + 1) & mask; heads_[j] != kNil; j = (j + 1) & mask) {
    const std::size_t ideal = slot_of(keys_[j]);
    const bool between = (i <= j) ? (i < ideal && ideal <= j) : (i < ideal || ideal <= j);
    if (between) continue;
    keys_[i] = keys_[j];
    heads_[i] = heads_[j];
    heads_[j] = kNil;
    i = j;
  }
}

void PrefixIndex::grow_table() {
  std::vector<BlockHash> old_keys = std::move(keys_);
  std::vector<std::uint32_t> old_heads = std::move(heads_);
  ++table_bits_;
  keys_.assign(std::size_t{1} << table_bits_, 0);
  heads_.assign(std::size_t{1} << table_bits_, kNil);
  const std::size_t mask = keys_.size() - 1;
  for (std::size_t s = 0; s < old_keys.size(); ++s) {
    if (old_heads[s] == kNil) continue;
    std::size_t i = slot_of(old_keys[s]);
    while (heads_[i] != kNil) i = (i + 1) & mask;
    keys_[i] = old_keys[s];
    heads_[i] = old_heads[s];
  }
}

// ---------------------------------------------------------------------------------------------------------
// Entries and per-worker LRU lists.

PrefixIndex::WorkerLru& PrefixIndex::lru(WorkerId w) {
  if (w >= workers_.size()) workers_.resize(static_cast<std::size_t>(w) + 1);
  return workers_[w];
}

std::uint32_t PrefixIndex::find_entry(WorkerId w, BlockHash h) const {
  const std::uint32_t* head = find_head(h);
  if (head == nullptr) return kNil;
  for (std::uint32_t e = *head; e != kNil; e = entries_[e].next_in_block) {
    if (entries_[e].worker == w) return e;
  }
  return kNil;
}

std::uint32_t PrefixIndex::alloc_entry() {
  ++live_entries_;
  if (free_head_ != kNil) {
    const std::uint32_t e = free_head_;
    free_head_ = entries_[e].next_in_block;
    return e;
  }
  return entries_.push_back();
}

std::uint32_t PrefixIndex::EntryPool::push_back() {
  if ((size_ >> kChunkBits) >= chunks_.size()) chunks_.push_back(std::make_unique<Entry[]>(std::size_t{1} << kChunkBits));
  return size_++;
}

std::size_t PrefixIndex::EntryPool::memory_bytes() const {
  return chunks_.size() * ((std::size_t{1} << kChunkBits) * sizeof(Entry) + sizeof(std::unique_ptr<Entry[]>));
}

void PrefixIndex::lru_unlink(WorkerLru& l, std::uint32_t e) {
  Entry& en = entries_[e];
  if (en.lru_prev != kNil) entries_[en.lru_prev].lru_next = en.lru_next; else l.head = en.lru_next;
  if (en.lru_next != kNil) entries_[en.lru_next].lru_prev = en.lru_prev; else l.tail = en.lru_prev;
  en.lru_prev = en.lru_next = kNil;
}

void PrefixIndex::lru_push_front(WorkerLru& l, std::uint32_t e) {
  Entry& en = entries_[e];
  en.lru_prev = kNil;
  en.lru_next = l.head;
  if (l.head != kNil) entries_[l.head].lru_prev = e; else l.tail = e;
  l.head = e;
}

std::uint32_t PrefixIndex::touch(WorkerId w, BlockHash h, Tier tier) {
  WorkerLru& l = lru(w);
  std::uint32_t e = find_entry(w, h);
  if (e != kNil) {
    Entry& en = entries_[e];
    if (en.hits == 0) ++l.reused;
    if (en.hits < 255) ++en.hits;
    en.tier = tier;
    lru_unlink(l, e);
    lru_push_front(l, e);
    return e;
  }
  e = alloc_entry();
  std::uint32_t& head = insert_head(h);  // may grow the table; `head` is taken after growth
  entries_[e] = Entry{h, head, kNil, kNil, w, tier, 0};
  head = e;
  lru_push_front(l, e);
  ++l.count;
  return e;
}

void PrefixIndex::erase_entry(std::uint32_t e) {
  Entry& en = entries_[e];
  WorkerLru& l = workers_[en.worker];
  lru_unlink(l, e);
  --l.count;
  if (en.hits > 0) --l.reused;
  std::uint32_t* head = find_head(en.hash);
  if (*head == e) {
    // The last entry of a block frees its slot; erase_slot needs the slot still occupied to find it.
    if (en.next_in_block == kNil) erase_slot(en.hash); else *head = en.next_in_block;
  } else {
    std::uint32_t p = *head;
    while (entries_[p].next_in_block != e) p = entries_[p].next_in_block;
    entries_[p].next_in_block = en.next_in_block;
  }
  en.next_in_block = free_head_;
  free_head_ = e;
  --live_entries_;
}

// ---------------------------------------------------------------------------------------------------------

void PrefixIndex::set_capacity(WorkerId worker, std::uint64_t blocks) {
  std::unique_lock lock(mu_);
  lru(worker).capacity = blocks;
}

std::uint64_t PrefixIndex::capacity(WorkerId worker) const {
  std::shared_lock lock(mu_);
  return worker < workers_.size() ? workers_[worker].capacity : 0;
}

std::size_t PrefixIndex::record(WorkerId worker, std::span<const BlockHash> chain, Tier tier) {
  std::unique_lock lock(mu_);
  // Tail first, so the chain's first block ends up most recently used.
  for (std::size_t i = chain.size(); i-- > 0;) touch(worker, chain[i], tier);
  WorkerLru& l = workers_[worker];
  std::size_t evicted = 0;
  while (l.capacity != 0 && l.count > l.capacity) {
    erase_entry(l.tail);
    ++evicted;
  }
  return evicted;
}

void PrefixIndex::store(WorkerId worker, std::span<const BlockHash> blocks, Tier tier) {
  std::unique_lock lock(mu_);
  for (BlockHash h : blocks) touch(worker, h, tier);
}

std::size_t PrefixIndex::remove(WorkerId worker, std::span<const BlockHash> blocks) {
  std::unique_lock lock(mu_);
  if (worker >= workers_.size()) return 0;
  std::size_t removed = 0;
  for (BlockHash h : blocks) {
    const std::uint32_t e = find_entry(worker, h);
    if (e == kNil) continue;
    erase_entry(e);
    ++removed;
  }
  return removed;
}

void PrefixIndex::clear_worker(WorkerId worker) {
  std::unique_lock lock(mu_);
  if (worker >= workers_.size()) return;
  WorkerLru& l = workers_[worker];
  while (l.tail != kNil) erase_entry(l.tail);
}

void PrefixIndex::match(std::span<const BlockHash> chain, Match& out) const {
  std::shared_lock lock(mu_);
  out.blocks.assign(workers_.size(), 0);
  out.cpu_blocks.assign(workers_.size(), 0);
  out.longest = 0;
  for (std::uint32_t i = 0; i < chain.size(); ++i) {
    const std::uint32_t* head = find_head(chain[i]);
    if (head == nullptr) break;
    bool extended = false;
    for (std::uint32_t e = *head; e != kNil; e = entries_[e].next_in_block) {
      const Entry& en = entries_[e];
      // Only a worker that held every earlier block continues its run.
      if (out.blocks[en.worker] != i) continue;
      out.blocks[en.worker] = i + 1;
      if (en.tier == Tier::kCpu) ++out.cpu_blocks[en.worker];
      extended = true;
    }
    if (!extended) break;
    out.longest = i + 1;
  }
}

std::size_t PrefixIndex::worker_blocks(WorkerId worker) const {
  std::shared_lock lock(mu_);
  return worker < workers_.size() ? workers_[worker].count : 0;
}

std::size_t PrefixIndex::worker_reused_blocks(WorkerId worker) const {
  std::shared_lock lock(mu_);
  return worker < workers_.size() ? workers_[worker].reused : 0;
}

std::vector<BlockHash> PrefixIndex::worker_hashes(WorkerId worker) const {
  std::shared_lock lock(mu_);
  std::vector<BlockHash> out;
  if (worker >= workers_.size()) return out;
  out.reserve(workers_[worker].count);
  for (std::uint32_t e = workers_[worker].head; e != kNil; e = entries_[e].lru_next) out.push_back(entries_[e].hash);
  return out;
}

bool PrefixIndex::holds(WorkerId worker, BlockHash block) const {
  std::shared_lock lock(mu_);
  return find_entry(worker, block) != kNil;
}

std::size_t PrefixIndex::entries() const {
  std::shared_lock lock(mu_);
  return live_entries_;
}

std::size_t PrefixIndex::distinct_blocks() const {
  std::shared_lock lock(mu_);
  return used_slots_;
}

std::size_t PrefixIndex::memory_bytes() const {
  std::shared_lock lock(mu_);
  return entries_.memory_bytes() + keys_.capacity() * sizeof(BlockHash) +
         heads_.capacity() * sizeof(std::uint32_t) + workers_.capacity() * sizeof(WorkerLru);
}

}  // namespace kvroute::hashing
