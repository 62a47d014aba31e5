// FlatMap64: an open-addressing hash map from 64-bit keys to small trivially copyable values, for the
// per-block maps of KvEventApplier (engine hash -> own hash, own hash -> holder counts).
//
// Why not std::unordered_map: one node allocation and a pointer chase per block made the applier spend
// ~4x longer in its maps than the PrefixIndex spends on the same blocks (bench/event_ingest_bench.cc).
// Linear probing over one array, backward-shift deletion (no tombstones), growth at 70 % load. Any key value
// is allowed (occupancy is a separate byte). Keys are mixed once more because engine hashes can be small
// integers. Pointers returned are valid until the next insertion.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvroute::events::internal {

template <class V>
class FlatMap64 {
 public:
  FlatMap64() { rehash(16); }

  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  V* find(std::uint64_t key) {
    for (std::size_t i = slot(key);; i = (i + 1) & mask_) {
      if (!used_[i]) return nullptr;
      if (keys_[i] == key) return &values_[i];
    }
  }

  // The value of `key`, value-initialized if it was absent; .second is true when inserted.
  std::pair<V*, bool> try_emplace(std::uint64_t key) {
    if ((size_ + 1) * 10 > keys_.size() * 7) rehash(keys_.size() * 2);
    for (std::size_t i = slot(key);; i = (i + 1) & mask_) {
      if (!used_[i]) {
        used_[i] = 1;
        keys_[i] = key;
        values_[i] = V{};
        ++size_;
        return {&values_[i], true};
      }
      if (keys_[i] == key) return {&values_[i], false};
    }
  }

  bool erase(std::uint64_t key) {
    std::size_t i = slot(key);
    while (true) {
      if (!used_[i]) return false;
      if (keys_[i] == key) break;
      i = (i + 1) & mask_;
    }
    used_[i] = 0;
    --size_;
    // Shift later members of the probe run back so lookups never stop early at the hole.
    for (std::size_t j = (i + 1) & mask_; used_[j]; j = (j + 1) & mask_) {
      const std::size_t ideal = slot(keys_[j]);
      const bool between = (i <= j) ? (i < ideal && ideal <= j) : (i < ideal || ideal <= j);
      if (between) continue;
      keys_[i] = keys_[j];
      values_[i] = values_[j];
      used_[i] = 1;
      used_[j] = 0;
      i = j;
    }
    return true;
  }

  // Drops every entry and returns to a small table (a reset should also give the memory back).
  void clear() {
    keys_.clear();
    values_.clear();
    used_.clear();
    size_ = 0;
    rehash(16);
  }

  template <class F>
  void for_each(F&& f) {
    for (std::size_t i = 0; i < keys_.size(); ++i) {
      if (used_[i]) f(keys_[i], values_[i]);
    }
  }

 private:
  std::size_t slot(std::uint64_t key) const {
    return static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_);
  }

  void rehash(std::size_t capacity) {
    std::vector<std::uint64_t> keys = std::move(keys_);
    std::vector<V> values = std::move(values_);
    std::vector<std::uint8_t> used = std::move(used_);
    keys_.assign(capacity, 0);
    values_.assign(capacity, V{});
    used_.assign(capacity, 0);
    mask_ = capacity - 1;
    int bits = 0;
    while ((std::size_t{1} << bits) < capacity) ++bits;
    shift_ = 64 - bits;
    for (std::size_t s = 0; s < keys.size(); ++s) {
      if (!used[s]) continue;
      std::size_t i = slot(keys[s]);
      while (used_[i]) i = (i + 1) & mask_;
      used_[i] = 1;
      keys_[i] = keys[s];
      values_[i] = values[s];
    }
  }

  std::vector<std::uint64_t> keys_;
  std::vector<V> values_;
  std::vector<std::uint8_t> used_;
  std::size_t size_ = 0;
  std::size_t mask_ = 0;
  int shift_ = 60;
};

}  // namespace kvroute::events::internal
