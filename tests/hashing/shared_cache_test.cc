#include "hashing/shared_cache.h"

#include <list>
#include <random>
#include <unordered_map>
#include <vector>

#include <gtest/gtest.h>

namespace kvroute::hashing {
namespace {

std::uint64_t mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Requests as a router sees them: one of `groups` shared prefixes (popularity skewed towards the first ones)
// of 20-400 blocks, then a tail of 1-200 blocks unique to the request. Block hashes are well mixed, as the
// chain's xxHash64 values are.
std::vector<std::vector<BlockHash>> workload(std::size_t requests, std::size_t groups, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<BlockHash>> prefixes(groups);
  for (std::size_t g = 0; g < groups; ++g) {
    prefixes[g].resize(20 + rng() % 381);
    for (auto& h : prefixes[g]) h = mix(rng());
  }
  std::vector<std::vector<BlockHash>> out;
  for (std::size_t r = 0; r < requests; ++r) {
    const double u = std::uniform_real_distribution<double>(0, 1)(rng);
    const auto g = static_cast<std::size_t>(static_cast<double>(groups) * u * u * u);
    std::vector<BlockHash> c = prefixes[g];
    const std::size_t tail = 1 + rng() % 200;
    for (std::size_t i = 0; i < tail; ++i) c.push_back(mix(rng()));
    out.push_back(std::move(c));
  }
  return out;
}

// A plain LRU of blocks, touched tail first; a hit is the leading run of blocks it holds.
class ReferenceLru {
 public:
  explicit ReferenceLru(std::size_t capacity) : capacity_(capacity) {}
  std::uint64_t access(const std::vector<BlockHash>& chain) {
    std::uint64_t run = 0;
    while (run < chain.size() && where_.count(chain[run])) ++run;
    for (std::size_t i = chain.size(); i-- > 0;) {
      auto it = where_.find(chain[i]);
      if (it != where_.end()) order_.erase(it->second);
      order_.push_front(chain[i]);
      where_[chain[i]] = order_.begin();
    }
    while (order_.size() > capacity_) {
      where_.erase(order_.back());
      order_.pop_back();
    }
    return run;
  }

 private:
  std::size_t capacity_;
  std::list<BlockHash> order_;
  std::unordered_map<BlockHash, std::list<BlockHash>::iterator> where_;
};

TEST(SharedCache, ExactBelowTheEntryBudgetAndEqualToOneLru) {
  const auto requests = workload(3000, 60, 1);
  SharedCache shared;
  shared.set_capacity(20000);  // far less than the ~270K distinct blocks: it evicts all the time
  EXPECT_EQ(shared.sample_rate(), 1.0);
  ReferenceLru reference(20000);
  std::uint64_t hits = 0;
  for (const auto& c : requests) {
    const std::uint64_t expected = reference.access(c);
    ASSERT_EQ(shared.access(c), expected);
    hits += expected;
  }
  EXPECT_GT(hits, 0u);
  EXPECT_EQ(shared.entries(), 20000u);
}

TEST(SharedCache, SampledEstimateIsCloseToTheExactCache) {
  const auto requests = workload(6000, 80, 2);
  SharedCache exact;
  exact.set_capacity(40000);
  SharedCache sampled(/*max_entries=*/5000);
  sampled.set_capacity(40000);
  EXPECT_EQ(sampled.sample_rate(), 1.0 / 8);
  std::uint64_t exact_hits = 0, sampled_hits = 0, blocks = 0;
  for (const auto& c : requests) {
    exact_hits += exact.access(c);
    sampled_hits += sampled.access(c);
    blocks += c.size();
  }
  EXPECT_LE(sampled.entries(), 5000u);
  ASSERT_GT(exact_hits, blocks / 10);  // a workload with real reuse
  const double ratio = static_cast<double>(sampled_hits) / static_cast<double>(exact_hits);
  EXPECT_NEAR(ratio, 1.0, 0.03) << "exact " << exact_hits << " sampled " << sampled_hits;
}

// Sampling stops at 1/8 however large the fleet: sparser, a short prefix every request shares could hold no
// sampled block at all and go uncounted.
TEST(SharedCache, SamplingStopsAtOneInEight) {
  SharedCache shared(/*max_entries=*/1000);
  shared.set_capacity(64000);
  EXPECT_EQ(shared.sample_rate(), 1.0 / 8);
  std::vector<BlockHash> c;
  for (std::uint64_t i = 0; i < 80000; ++i) c.push_back(mix(i));
  shared.access(c);
  EXPECT_EQ(shared.entries(), 8000u);  // capacity / 8, beyond max_entries
}

TEST(SharedCache, UnknownCapacityCountsNothing) {
  SharedCache shared;
  const std::vector<BlockHash> c = {mix(1), mix(2), mix(3)};
  EXPECT_EQ(shared.access(c), 0u);
  EXPECT_EQ(shared.access(c), 0u);
  shared.set_capacity(100);
  EXPECT_EQ(shared.access(c), 0u);
  EXPECT_EQ(shared.access(c), 3u);
}

TEST(SharedCache, ShrinkingEvictsAndANewSampleRateStartsOver) {
  SharedCache shared(/*max_entries=*/1000);
  shared.set_capacity(1000);
  std::vector<BlockHash> a, b;
  for (std::uint64_t i = 0; i < 600; ++i) a.push_back(mix(i));
  for (std::uint64_t i = 600; i < 1000; ++i) b.push_back(mix(i));
  shared.access(a);
  shared.access(b);
  EXPECT_EQ(shared.entries(), 1000u);
  EXPECT_TRUE(shared.set_capacity(500));  // same rate: b, the most recent, stays, and a's first 100 blocks
  EXPECT_FALSE(shared.set_capacity(500));  // unchanged
  EXPECT_EQ(shared.entries(), 500u);
  EXPECT_EQ(shared.access(b), 400u);
  EXPECT_EQ(shared.access(a), 100u);
  shared.set_capacity(4000);  // rate 1/4: what was kept at rate 1 is dropped
  EXPECT_EQ(shared.sample_rate(), 0.25);
  EXPECT_EQ(shared.entries(), 0u);
  EXPECT_EQ(shared.access(a), 0u);
  EXPECT_NEAR(static_cast<double>(shared.access(a)), 600.0, 12.0);
}

}  // namespace
}  // namespace kvroute::hashing
