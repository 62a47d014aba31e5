#include "hashing/prefix_index.h"

#include <algorithm>
#include <bit>
#include <mutex>

namespace kvroute::hashing {

namespace {
constexpr std::size_t kInitialSlots = 1024;
// Maximum load of the block table before it grows by a quarter (linear probing stays short below this). Growing
// by a quarter rather than doubling keeps the load between 0.5 and 0.625, so the table costs at most 40 bytes
// per block (20-byte slots), at most 20 per (block, worker) entry wherever blocks have two or more holders, and
// with the 20-byte entries at most 40 bytes per entry in all. With 1M entries on 402K blocks (kvroute-routing-bench,
// BM_IndexMemory) the doubling table was at 0.38 load and an entry took 45 bytes in all; 33 now (docs/overhead.md).
constexpr double kMaxLoad = 0.625;
// match_by_holders asks for the slot of the block this many places ahead while it probes the current one: a chain's
// blocks sit in unrelated slots of a table far larger than the caches, and each probe would otherwise wait for
// memory in turn.
constexpr std::size_t kPrefetchAhead = 8;
}  // namespace

PrefixIndex::PrefixIndex() {
  slots_.assign(kInitialSlots, Slot{{0, 0}, {0, 0}, kNil});
  slot_count_ = slots_.size();
}

// ---------------------------------------------------------------------------------------------------------
// Block table: linear probing with backward-shift deletion, keyed by the block hash. The hash is already
// well mixed (XXH3), but callers may feed small integers (tests, traces), so it is multiplied once more, and
// mapped onto the table's size by the high half of a 64 x 64-bit product (the size need not be a power of two).

std::size_t PrefixIndex::slot_of(BlockHash h) const {
  const unsigned __int128 x = static_cast<unsigned __int128>(h * 0x9E3779B97F4A7C15ull) * slot_count_;
  return static_cast<std::size_t>(x >> 64);
}

std::size_t PrefixIndex::find_slot(BlockHash h) const {
  for (std::size_t i = slot_of(h);; i = next_slot(i)) {
    const Slot& s = slots_[i];
    if (s.head == kNil) return kNoSlot;
    if (s.key() == h) return i;
  }
}

std::size_t PrefixIndex::insert_slot(BlockHash h) {
  if (static_cast<double>(used_slots_ + 1) > kMaxLoad * static_cast<double>(slot_count_)) grow_table();
  for (std::size_t i = slot_of(h);; i = next_slot(i)) {
    Slot& s = slots_[i];
    if (s.head == kNil) {
      s.set_key(h);
      s.set_holders(0);
      ++used_slots_;
      return i;  // head still kNil: the caller links the first entry
    }
    if (s.key() == h) return i;
  }
}

void PrefixIndex::erase_slot(std::size_t i) {
  slots_[i].head = kNil;
  --used_slots_;
  // Shift later members of the probe run back so lookups never stop early at the hole.
  for (std::size_t j = next_slot(i); slots_[j].head != kNil; j = next_slot(j)) {
    const std::size_t ideal = slot_of(slots_[j].key());
    const bool between = (i <= j) ? (i < ideal && ideal <= j) : (i < ideal || ideal <= j);
    if (between) continue;
    slots_[i] = slots_[j];
    slots_[j].head = kNil;
    point_entries_at(i);
    i = j;
  }
}

void PrefixIndex::grow_table() {
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(old.size() + old.size() / 4, Slot{{0, 0}, {0, 0}, kNil});
  slot_count_ = slots_.size();
  for (const Slot& s : old) {
    if (s.head == kNil) continue;
    std::size_t i = slot_of(s.key());
    while (slots_[i].head != kNil) i = next_slot(i);
    slots_[i] = s;
    point_entries_at(i);
  }
}

void PrefixIndex::point_entries_at(std::size_t i) {
  for (std::uint32_t e = slots_[i].head; e != kNil; e = entries_[e].next_in_block) {
    entries_[e].slot = static_cast<std::uint32_t>(i);
  }
}

// ---------------------------------------------------------------------------------------------------------
// Entries and per-worker LRU lists.

PrefixIndex::WorkerLru& PrefixIndex::lru(WorkerId w) {
  if (w >= workers_.size()) workers_.resize(static_cast<std::size_t>(w) + 1);
  return workers_[w];
}

std::uint32_t PrefixIndex::find_entry(WorkerId w, BlockHash h) const {
  const std::size_t s = find_slot(h);
  if (s == kNoSlot || (slots_[s].holders() & holder_bit(w)) == 0) return kNil;
  for (std::uint32_t e = slots_[s].head; e != kNil; e = entries_[e].next_in_block) {
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

// find_entry for an update: the worker's entry also moves to the front of the block's list. A block held by
// many workers (a shared system prompt) has a long list, and the worker that touches it is likely to touch it
// again (its chats return to it): the next walk then stops at the first entry.
std::uint32_t PrefixIndex::find_entry_to_front(WorkerId w, BlockHash h) {
  const std::size_t s = find_slot(h);
  if (s == kNoSlot || (slots_[s].holders() & holder_bit(w)) == 0) return kNil;
  for (std::uint32_t prev = kNil, e = slots_[s].head; e != kNil; prev = e, e = entries_[e].next_in_block) {
    if (entries_[e].worker != w) continue;
    if (prev != kNil) {
      entries_[prev].next_in_block = entries_[e].next_in_block;
      entries_[e].next_in_block = slots_[s].head;
      slots_[s].head = e;
    }
    return e;
  }
  return kNil;
}

std::uint32_t PrefixIndex::touch(WorkerId w, BlockHash h, Tier tier, bool keep_predicted) {
  WorkerLru& l = lru(w);
  std::uint32_t e = find_entry_to_front(w, h);
  if (e != kNil) {
    Entry& en = entries_[e];
    if (en.hits == 0) ++l.reused;
    if (en.hits < 255) ++en.hits;
    if (keep_predicted && en.tier == Tier::kPredicted) tier = Tier::kPredicted;
    // A prediction never demotes what the worker's events confirmed: drop_tier(kPredicted), when the worker's
    // stream comes (back) up, would take the block out although the worker holds it, and a prefix hit
    // publishes no event that could bring it back.
    if (tier == Tier::kPredicted && en.tier != Tier::kPredicted) tier = en.tier;
    if (en.tier != tier) {
      if (en.tier == Tier::kCpu) --cpu_entries_;
      if (tier == Tier::kCpu) ++cpu_entries_;
    }
    en.tier = tier;
    lru_unlink(l, e);
    lru_push_front(l, e);
    return e;
  }
  e = alloc_entry();
  const std::size_t s = insert_slot(h);  // may grow the table, so the slot is taken after it
  Slot& slot = slots_[s];
  entries_[e] = Entry{static_cast<std::uint32_t>(s), slot.head, kNil, kNil, w, tier, 0};
  slot.head = e;
  slot.set_holders(slot.holders() | holder_bit(w));
  if (tier == Tier::kCpu) ++cpu_entries_;
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
  if (en.tier == Tier::kCpu) --cpu_entries_;
  const std::size_t s = en.slot;
  Slot& slot = slots_[s];
  if (slot.head == e && en.next_in_block == kNil) {
    erase_slot(s);  // the block's last entry frees its slot
  } else {
    if (slot.head == e) {
      slot.head = en.next_in_block;
    } else {
      std::uint32_t p = slot.head;
      while (entries_[p].next_in_block != e) p = entries_[p].next_in_block;
      entries_[p].next_in_block = en.next_in_block;
    }
    // Another holder may share this worker's bit (ids 64 apart), so the summary is rebuilt from the list.
    std::uint64_t holders = 0;
    for (std::uint32_t q = slot.head; q != kNil; q = entries_[q].next_in_block) holders |= holder_bit(entries_[q].worker);
    slot.set_holders(holders);
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

std::size_t PrefixIndex::limit(WorkerId worker, std::uint64_t blocks) {
  std::unique_lock lock(mu_);
  WorkerLru& l = lru(worker);
  l.capacity = blocks;
  return evict_beyond_capacity(l);
}

std::size_t PrefixIndex::evict_beyond_capacity(WorkerLru& l) {
  std::size_t evicted = 0;
  while (l.capacity != 0 && l.count > l.capacity) {
    erase_entry(l.tail);
    ++evicted;
  }
  return evicted;
}

std::uint64_t PrefixIndex::capacity(WorkerId worker) const {
  std::shared_lock lock(mu_);
  return worker < workers_.size() ? workers_[worker].capacity : 0;
}

std::size_t PrefixIndex::record(WorkerId worker, std::span<const BlockHash> chain, Tier tier) {
  std::unique_lock lock(mu_);
  // Tail first, so the chain's first block ends up most recently used.
  for (std::size_t i = chain.size(); i-- > 0;) touch(worker, chain[i], tier);
  return evict_beyond_capacity(workers_[worker]);
}

void PrefixIndex::record_routed(WorkerId worker, std::span<const BlockHash> chain, std::size_t predicted_from) {
  std::unique_lock lock(mu_);
  for (std::size_t i = chain.size(); i-- > 0;) {
    if (i >= predicted_from) {
      touch(worker, chain[i], Tier::kPredicted);
    } else {
      touch(worker, chain[i], Tier::kGpu, /*keep_predicted=*/true);
    }
  }
}

void PrefixIndex::store(WorkerId worker, std::span<const BlockHash> blocks, Tier tier) {
  {
    std::unique_lock lock(mu_);
    for (BlockHash h : blocks) touch(worker, h, tier);
  }
  if (store_listener_) store_listener_(worker, blocks);
}

void PrefixIndex::expect(WorkerId worker, std::span<const BlockHash> chain) {
  std::unique_lock lock(mu_);
  for (BlockHash h : chain) {
    const std::uint32_t e = find_entry(worker, h);
    touch(worker, h, e == kNil ? Tier::kPredicted : entries_[e].tier);
  }
}

std::size_t PrefixIndex::drop_unconfirmed(WorkerId worker, std::span<const BlockHash> chain) {
  std::unique_lock lock(mu_);
  if (worker >= workers_.size()) return 0;
  std::size_t dropped = 0;
  for (BlockHash h : chain) {
    const std::uint32_t e = find_entry(worker, h);
    if (e != kNil && entries_[e].tier == Tier::kPredicted) {
      erase_entry(e);
      ++dropped;
    }
  }
  return dropped;
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
  if (workers_.size() <= 64 && cpu_entries_ == 0) {
    match_by_holders(chain, out);
  } else {
    match_by_entries(chain, out);
  }
}

// Exact when every worker id is below 64 (one bit each) and no entry is on a CPU tier (no per-worker CPU
// counts to keep): the set of workers still matching shrinks by one AND per block.
void PrefixIndex::match_by_holders(std::span<const BlockHash> chain, Match& out) const {
  const std::size_t n = workers_.size();
  std::uint64_t active = n == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << n) - 1;
  std::uint32_t i = 0;
  for (; i < chain.size(); ++i) {
    if (i + kPrefetchAhead < chain.size()) __builtin_prefetch(&slots_[slot_of(chain[i + kPrefetchAhead])]);
    const std::size_t s = find_slot(chain[i]);
    if (s == kNoSlot) break;
    const std::uint64_t next = active & slots_[s].holders();
    if (next == 0) break;
    // Workers that stop here hold exactly the i blocks before this one.
    for (std::uint64_t gone = active & ~next; gone != 0; gone &= gone - 1) out.blocks[std::countr_zero(gone)] = i;
    active = next;
  }
  for (; active != 0; active &= active - 1) out.blocks[std::countr_zero(active)] = i;
  out.longest = i;
}

void PrefixIndex::match_by_entries(std::span<const BlockHash> chain, Match& out) const {
  std::size_t running = workers_.size();  // workers that held every block so far
  for (std::uint32_t i = 0; i < chain.size(); ++i) {
    const std::size_t s = find_slot(chain[i]);
    if (s == kNoSlot) break;
    std::size_t extended = 0;
    for (std::uint32_t e = slots_[s].head; e != kNil && extended < running; e = entries_[e].next_in_block) {
      const Entry& en = entries_[e];
      // Only a worker that held every earlier block continues its run.
      if (out.blocks[en.worker] != i) continue;
      out.blocks[en.worker] = i + 1;
      if (en.tier == Tier::kCpu) ++out.cpu_blocks[en.worker];
      ++extended;
    }
    if (extended == 0) break;
    running = extended;
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

void PrefixIndex::worker_stats(std::vector<std::uint64_t>& reused, std::vector<std::uint64_t>& capacity) const {
  capacity.resize(reused.size());
  std::shared_lock lock(mu_);
  for (std::size_t w = 0; w < reused.size(); ++w) {
    reused[w] = w < workers_.size() ? workers_[w].reused : 0;
    capacity[w] = w < workers_.size() ? workers_[w].capacity : 0;
  }
}

std::vector<BlockHash> PrefixIndex::worker_hashes(WorkerId worker) const {
  std::shared_lock lock(mu_);
  std::vector<BlockHash> out;
  if (worker >= workers_.size()) return out;
  out.reserve(workers_[worker].count);
  for (std::uint32_t e = workers_[worker].head; e != kNil; e = entries_[e].lru_next) out.push_back(hash_of(e));
  return out;
}

std::vector<std::pair<BlockHash, Tier>> PrefixIndex::worker_entries(WorkerId worker) const {
  std::shared_lock lock(mu_);
  std::vector<std::pair<BlockHash, Tier>> out;
  if (worker >= workers_.size()) return out;
  out.reserve(workers_[worker].count);
  for (std::uint32_t e = workers_[worker].head; e != kNil; e = entries_[e].lru_next) {
    out.emplace_back(hash_of(e), entries_[e].tier);
  }
  return out;
}

std::size_t PrefixIndex::drop_tier(WorkerId worker, Tier tier) {
  std::unique_lock lock(mu_);
  if (worker >= workers_.size()) return 0;
  std::size_t dropped = 0;
  for (std::uint32_t e = workers_[worker].head; e != kNil;) {
    const std::uint32_t next = entries_[e].lru_next;
    if (entries_[e].tier == tier) {
      erase_entry(e);
      ++dropped;
    }
    e = next;
  }
  return dropped;
}

std::optional<Tier> PrefixIndex::tier(WorkerId worker, BlockHash block) const {
  std::shared_lock lock(mu_);
  const std::uint32_t e = find_entry(worker, block);
  if (e == kNil) return std::nullopt;
  return entries_[e].tier;
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
  return entries_.memory_bytes() + slots_.capacity() * sizeof(Slot) + workers_.capacity() * sizeof(WorkerLru);
}

}  // namespace kvroute::hashing
