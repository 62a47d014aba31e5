#include "bench/bounds.h"

#include <algorithm>
#include <vector>

#include "hashing/prefix_index.h"

namespace kvroute::bench {
namespace {

// Open-addressing set of block hashes (insert and lookup only); far lighter than std::unordered_set for the
// millions of blocks of a long trace.
class HashSet {
 public:
  HashSet() : slots_(1024, 0) {}
  bool contains(std::uint64_t h) const {
    const std::uint64_t k = key(h);
    for (std::size_t i = slot(k);; i = (i + 1) & (slots_.size() - 1)) {
      if (slots_[i] == 0) return false;
      if (slots_[i] == k) return true;
    }
  }
  void insert(std::uint64_t h) {
    if ((size_ + 1) * 4 > slots_.size() * 3) grow();
    place(key(h));
  }

 private:
  // 0 marks an empty slot, so hash 0 is stored as another constant (a collision only with that constant).
  static std::uint64_t key(std::uint64_t h) { return h == 0 ? 0x9E3779B97F4A7C15ull : h; }
  std::size_t slot(std::uint64_t k) const {
    return static_cast<std::size_t>((k * 0xBF58476D1CE4E5B9ull) >> 20) & (slots_.size() - 1);
  }
  void place(std::uint64_t k) {
    for (std::size_t i = slot(k);; i = (i + 1) & (slots_.size() - 1)) {
      if (slots_[i] == k) return;
      if (slots_[i] == 0) {
        slots_[i] = k;
        ++size_;
        return;
      }
    }
  }
  void grow() {
    std::vector<std::uint64_t> old = std::move(slots_);
    slots_.assign(old.size() * 2, 0);
    size_ = 0;
    for (std::uint64_t k : old)
      if (k != 0) place(k);
  }
  std::vector<std::uint64_t> slots_;
  std::size_t size_ = 0;
};

}  // namespace

std::uint64_t servable_cached_tokens(std::uint64_t matched_blocks, std::uint64_t prompt_tokens) {
  if (prompt_tokens == 0) return 0;
  // vLLM caps a prefix hit at prompt - 1 tokens, in whole blocks.
  return std::min(matched_blocks, (prompt_tokens - 1) / kBlockTokens) * kBlockTokens;
}

double upper_bound_hit_rate(const Workload& w) {
  HashSet seen;
  std::uint64_t hit = 0, total = 0;
  for (const Request& r : w.requests) {
    std::uint64_t m = 0;
    while (m < r.chain.hashes.size() && seen.contains(r.chain.hashes[m])) ++m;
    hit += servable_cached_tokens(m, r.prompt_tokens);
    total += r.prompt_tokens;
    for (auto h : r.chain.hashes) seen.insert(h);
    for (auto h : r.output_blocks) seen.insert(h);
  }
  return total ? static_cast<double>(hit) / static_cast<double>(total) : 0.0;
}

double capacity_bound_hit_rate(const Workload& w, std::uint64_t capacity_blocks) {
  hashing::PrefixIndex lru;
  lru.set_capacity(0, std::max<std::uint64_t>(capacity_blocks, 1));
  hashing::PrefixIndex::Match match;
  std::vector<hashing::BlockHash> all;
  std::uint64_t hit = 0, total = 0;
  for (const Request& r : w.requests) {
    lru.match(r.chain.hashes, match);
    hit += servable_cached_tokens(match.of(0), r.prompt_tokens);
    total += r.prompt_tokens;
    all.assign(r.chain.hashes.begin(), r.chain.hashes.end());
    all.insert(all.end(), r.output_blocks.begin(), r.output_blocks.end());
    // A request larger than the whole cache keeps only its first blocks (the tail is evicted first).
    if (all.size() > capacity_blocks) all.resize(capacity_blocks);
    lru.record(0, all);
  }
  return total ? static_cast<double>(hit) / static_cast<double>(total) : 0.0;
}

}  // namespace kvroute::bench
