#include "hashing/shared_cache.h"

#include <algorithm>

namespace kvroute::hashing {

SharedCache::SharedCache(std::uint64_t max_entries) : max_entries_(std::max<std::uint64_t>(max_entries, 1)) {}

bool SharedCache::set_capacity(std::uint64_t blocks) {
  std::lock_guard lock(mu_);
  if (blocks == capacity_) return false;
  int bits = 0;
  while ((blocks >> bits) > max_entries_ && bits < kMaxRateBits) ++bits;
  if (bits != rate_bits_) lru_.clear_worker(0);
  rate_bits_ = bits;
  capacity_ = blocks;
  lru_.set_capacity(0, std::max<std::uint64_t>(blocks >> bits, 1));
  // Evict down to a smaller capacity now rather than at the next access.
  if (blocks > 0) lru_.record(0, {});
  return true;
}

std::uint64_t SharedCache::capacity() const {
  std::lock_guard lock(mu_);
  return capacity_;
}

double SharedCache::sample_rate() const {
  std::lock_guard lock(mu_);
  return 1.0 / static_cast<double>(std::uint64_t{1} << rate_bits_);
}

bool SharedCache::sampled(BlockHash h) const {
  if (rate_bits_ == 0) return true;
  // The chain hashes are xxHash64 values already; the multiply spreads them once more so the slice does not
  // depend on which of their bits are best mixed.
  return ((h * 0x9E3779B97F4A7C15ull) >> (64 - rate_bits_)) == 0;
}

std::uint64_t SharedCache::access(std::span<const BlockHash> chain) {
  std::lock_guard lock(mu_);
  if (capacity_ == 0 || chain.empty()) return 0;
  if (rate_bits_ == 0) {
    lru_.match(chain, match_);
    const std::uint64_t held = match_.of(0);
    lru_.record(0, chain);
    return held;
  }
  kept_.clear();
  positions_.clear();
  for (std::size_t i = 0; i < chain.size(); ++i) {
    if (!sampled(chain[i])) continue;
    kept_.push_back(chain[i]);
    positions_.push_back(static_cast<std::uint32_t>(i));
  }
  if (kept_.empty()) return 0;
  lru_.match(kept_, match_);
  const std::size_t k = match_.of(0);
  lru_.record(0, kept_);
  if (k == 0) return 0;
  // The run ends after sampled block k-1 and before sampled block k (or the chain's end).
  const std::uint64_t low = positions_[k - 1] + 1u;
  const std::uint64_t high = k < positions_.size() ? positions_[k] : chain.size();
  return low + (high - low) / 2;
}

std::size_t SharedCache::entries() const {
  std::lock_guard lock(mu_);
  return lru_.worker_blocks(0);
}

std::size_t SharedCache::memory_bytes() const {
  std::lock_guard lock(mu_);
  return lru_.memory_bytes();
}

}  // namespace kvroute::hashing
