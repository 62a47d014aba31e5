#include "hashing/prefix_index.h"

#include <algorithm>
#include <list>
#include <numeric>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace kvroute::hashing {
namespace {

std::vector<BlockHash> chain(std::uint64_t base, std::size_t n) {
  std::vector<BlockHash> c(n);
  for (std::size_t i = 0; i < n; ++i) c[i] = base * 1000003 + i;
  return c;
}

TEST(PrefixIndex, MatchCountsLeadingBlocksPerWorker) {
  PrefixIndex idx;
  const auto a = chain(1, 10);
  idx.record(0, std::span(a).first(10));
  idx.record(1, std::span(a).first(4));
  idx.record(2, std::span(a).subspan(2, 8));  // holds later blocks but not the first: no match
  PrefixIndex::Match m;
  idx.match(a, m);
  EXPECT_EQ(m.of(0), 10u);
  EXPECT_EQ(m.of(1), 4u);
  EXPECT_EQ(m.of(2), 0u);
  EXPECT_EQ(m.of(7), 0u);  // never seen
  EXPECT_EQ(m.longest, 10u);
}

TEST(PrefixIndex, MatchStopsAtFirstGap) {
  PrefixIndex idx;
  auto a = chain(1, 6);
  idx.record(0, a);
  std::vector<BlockHash> hole = {a[0], a[1], a[3]};
  idx.remove(0, std::vector<BlockHash>{a[2]});
  PrefixIndex::Match m;
  idx.match(a, m);
  EXPECT_EQ(m.of(0), 2u);
}

TEST(PrefixIndex, EvictsLeastRecentlyUsedBeyondCapacityTailFirst) {
  PrefixIndex idx;
  idx.set_capacity(0, 10);
  const auto a = chain(1, 6), b = chain(2, 6);
  idx.record(0, a);
  EXPECT_EQ(idx.record(0, b), 2u);  // 12 blocks in a 10-block worker
  PrefixIndex::Match m;
  idx.match(a, m);
  EXPECT_EQ(m.of(0), 4u);  // a lost its tail, kept its beginning
  idx.match(b, m);
  EXPECT_EQ(m.of(0), 6u);
  EXPECT_EQ(idx.worker_blocks(0), 10u);
}

// A capacity learned late (a new router replica replays the others' routing before the worker's metrics give
// its capacity) applies at once: the same blocks remain as if it had been known all along.
TEST(PrefixIndex, ALimitLearnedLateEvictsAtOnceWhatAnLruWouldHave) {
  PrefixIndex late, known;
  known.set_capacity(0, 10);
  const auto a = chain(1, 6), b = chain(2, 6), c = chain(3, 6);
  for (PrefixIndex* idx : {&late, &known}) {
    idx->record(0, a);
    idx->record(0, b);
    idx->record(0, a);
    idx->record(0, c);
  }
  EXPECT_EQ(late.worker_blocks(0), 18u);
  EXPECT_EQ(late.limit(0, 10), 8u);
  EXPECT_EQ(late.worker_blocks(0), 10u);
  for (const auto& x : {a, b, c}) {
    PrefixIndex::Match ml, mk;
    late.match(x, ml);
    known.match(x, mk);
    EXPECT_EQ(ml.of(0), mk.of(0));
  }
  EXPECT_EQ(late.capacity(0), 10u);
  EXPECT_EQ(late.limit(0, 0), 0u);  // 0: unlimited, nothing evicted
}

// A worker whose event stream is not (yet) live is in approximate mode: the router records what it routes there
// (and a new replica, what the others routed) as predictions. When the stream comes up, the predictions the
// events did not confirm are dropped (drop_tier). A block the events had confirmed stays: the worker holds it,
// and a prefix hit publishes no event that would tell the router again.
TEST(PrefixIndex, APredictionNeverDemotesABlockTheWorkersEventsConfirmed) {
  PrefixIndex idx;
  const auto stored = chain(1, 8), routed = chain(2, 8);
  idx.store(0, stored, Tier::kGpu);  // what the worker's replayed events say it holds
  idx.record(0, stored);             // routed there before the stream is live
  idx.record(0, routed);
  EXPECT_EQ(idx.drop_tier(0, Tier::kPredicted), 8u);  // the stream is live: only `routed` goes
  PrefixIndex::Match m;
  idx.match(stored, m);
  EXPECT_EQ(m.of(0), 8u);
  idx.match(routed, m);
  EXPECT_EQ(m.of(0), 0u);
}

TEST(PrefixIndex, TouchRefreshesRecency) {
  PrefixIndex idx;
  idx.set_capacity(0, 8);
  const auto a = chain(1, 4), b = chain(2, 4), c = chain(3, 4);
  idx.record(0, a);
  idx.record(0, b);
  idx.record(0, a);  // a is now more recent than b
  idx.record(0, c);  // evicts b
  PrefixIndex::Match m;
  idx.match(a, m);
  EXPECT_EQ(m.of(0), 4u);
  idx.match(b, m);
  EXPECT_EQ(m.of(0), 0u);
  EXPECT_EQ(idx.worker_reused_blocks(0), 4u);
}

TEST(PrefixIndex, PreciseStoreRemoveClearAndTiers) {
  PrefixIndex idx;
  const auto a = chain(1, 5);
  idx.store(3, std::span(a).first(3), Tier::kGpu);
  idx.store(3, std::span(a).subspan(3), Tier::kCpu);
  PrefixIndex::Match m;
  idx.match(a, m);
  EXPECT_EQ(m.of(3), 5u);
  EXPECT_EQ(m.cpu_of(3), 2u);
  EXPECT_EQ(idx.remove(3, std::vector<BlockHash>{a[4], 424242}), 1u);
  idx.match(a, m);
  EXPECT_EQ(m.of(3), 4u);
  idx.clear_worker(3);
  idx.match(a, m);
  EXPECT_EQ(m.of(3), 0u);
  EXPECT_EQ(idx.entries(), 0u);
  EXPECT_EQ(idx.distinct_blocks(), 0u);
}

TEST(PrefixIndex, DropTierKeepsConfirmedEntries) {
  PrefixIndex idx;
  const auto a = chain(1, 6);
  idx.record(0, a);                                  // predicted
  idx.store(0, std::span(a).first(2), Tier::kGpu);   // confirmed by events
  EXPECT_EQ(idx.drop_tier(0, Tier::kPredicted), 4u);
  auto entries = idx.worker_entries(0);
  ASSERT_EQ(entries.size(), 2u);
  for (const auto& [h, tier] : entries) EXPECT_EQ(tier, Tier::kGpu);
  PrefixIndex::Match m;
  idx.match(a, m);
  EXPECT_EQ(m.of(0), 2u);
}

TEST(PrefixIndex, ExpectedBlocksAreConfirmedByEventsOrDropped) {
  PrefixIndex idx;
  const auto a = chain(1, 6);
  idx.store(0, std::span(a).first(2), Tier::kGpu);   // already held
  idx.expect(0, a);                                  // the router just routed the whole chain here
  PrefixIndex::Match m;
  idx.match(a, m);
  EXPECT_EQ(m.of(0), 6u);                            // a burst on this prefix sees it at once
  EXPECT_EQ(idx.tier(0, a[3]), Tier::kPredicted);
  idx.store(0, std::span(a).subspan(2, 2), Tier::kGpu);  // the worker's events confirm two more
  EXPECT_EQ(idx.tier(0, a[3]), Tier::kGpu);
  EXPECT_EQ(idx.tier(1, a[3]), std::nullopt);        // another worker
  EXPECT_EQ(idx.drop_unconfirmed(0, a), 2u);         // the last two never came
  EXPECT_EQ(idx.tier(0, a[5]), std::nullopt);
  idx.match(a, m);
  EXPECT_EQ(m.of(0), 4u);
  for (const auto& [h, tier] : idx.worker_entries(0)) EXPECT_EQ(tier, Tier::kGpu);
}

// A routed request reads the blocks its worker already holds: expect() counts them hit again, as the worker's
// events count a block stored again, and keeps their tier. Every router replica applies every routed request
// with expect() (its own and, through the shared state, the others'), so each counts a worker's reuse alike
// whether the worker's events or another replica's record came first; kv_cost prices a copy into that worker's
// cache by that count.
TEST(PrefixIndex, ExpectCountsTheBlocksARequestReadsAsHitAgain) {
  const auto a = chain(1, 6);
  PrefixIndex events_first, record_first;
  events_first.store(0, std::span(a).first(3), Tier::kGpu);  // the first request's blocks, as the events report
  events_first.store(0, std::span(a).subspan(3, 1), Tier::kCpu);
  events_first.expect(0, a);  // a second request on the same prefix, routed here
  EXPECT_EQ(events_first.worker_reused_blocks(0), 4u);
  EXPECT_EQ(events_first.tier(0, a[3]), Tier::kCpu);  // still on the CPU tier
  EXPECT_EQ(events_first.tier(0, a[4]), Tier::kPredicted);
  record_first.expect(0, std::span(a).first(4));  // another replica's record of the first request came first
  record_first.store(0, std::span(a).first(4), Tier::kGpu);
  record_first.expect(0, a);
  EXPECT_EQ(record_first.worker_reused_blocks(0), 4u);
}

// kvroute-bench's simulation of precise mode: the blocks a routed request computes stay predicted until the
// worker's events store them, even when another request routed meanwhile matched them.
TEST(PrefixIndex, RecordRoutedMarksTheComputedBlocksPredicted) {
  PrefixIndex idx;
  const auto a = chain(1, 6);
  idx.record_routed(0, a, 2);  // the worker held a[0..2): it computes a[2..6)
  EXPECT_EQ(idx.tier(0, a[1]), Tier::kGpu);
  EXPECT_EQ(idx.tier(0, a[2]), Tier::kPredicted);
  idx.record_routed(0, a, 6);  // a follower that matched all six: a[2..6) are still being computed
  EXPECT_EQ(idx.tier(0, a[5]), Tier::kPredicted);
  EXPECT_EQ(idx.worker_hashes(0).front(), a[0]);  // the chain's first block most recently used, as record()
  idx.store(0, std::span(a).subspan(2), Tier::kGpu);  // the events
  for (const auto& [h, tier] : idx.worker_entries(0)) EXPECT_EQ(tier, Tier::kGpu);
}

TEST(PrefixIndex, DroppingAWorkerLeavesOthersIntact) {
  PrefixIndex idx;
  const auto a = chain(1, 8);
  for (WorkerId w = 0; w < 4; ++w) idx.record(w, a);
  idx.clear_worker(2);
  PrefixIndex::Match m;
  idx.match(a, m);
  EXPECT_EQ(m.of(0), 8u);
  EXPECT_EQ(m.of(1), 8u);
  EXPECT_EQ(m.of(2), 0u);
  EXPECT_EQ(m.of(3), 8u);
  EXPECT_EQ(idx.entries(), 24u);
  EXPECT_EQ(idx.worker_hashes(2).size(), 0u);
}

TEST(PrefixIndex, RandomizedAgainstReferenceModel) {
  // The table's backward-shift deletion and the entry lists are checked against std::set over many ops.
  PrefixIndex idx;
  std::vector<std::set<BlockHash>> truth(5);
  std::mt19937_64 rng(7);
  for (int op = 0; op < 20000; ++op) {
    const WorkerId w = rng() % 5;
    std::vector<BlockHash> hs(1 + rng() % 8);
    for (auto& h : hs) h = rng() % 3000;  // small key space: many collisions, many deletions
    if (rng() % 3 == 0) {
      idx.remove(w, hs);
      for (auto h : hs) truth[w].erase(h);
    } else {
      idx.store(w, hs, Tier::kGpu);
      truth[w].insert(hs.begin(), hs.end());
    }
  }
  std::size_t total = 0;
  for (WorkerId w = 0; w < 5; ++w) {
    auto got = idx.worker_hashes(w);
    EXPECT_EQ(std::set<BlockHash>(got.begin(), got.end()), truth[w]);
    for (BlockHash h = 0; h < 3000; h += 7) EXPECT_EQ(idx.holds(w, h), truth[w].count(h) == 1);
    total += truth[w].size();
  }
  EXPECT_EQ(idx.entries(), total);
}

// Entries name their block by its slot in the table, which moves when the table grows and when a deletion
// shifts a probe run back. Evicting from a worker's LRU tail finds the block through that slot: checked against
// an LRU per worker while the table grows from its first size through many growths and deletions.
TEST(PrefixIndex, EvictionFindsEachEntrysBlockWhileTheTableGrowsAndShifts) {
  constexpr std::size_t kCapacity = 900;
  PrefixIndex idx;
  std::vector<std::list<BlockHash>> lru(4);  // most recent first
  for (WorkerId w = 0; w < 4; ++w) idx.set_capacity(w, kCapacity);
  std::mt19937_64 rng(11);
  for (int op = 0; op < 4000; ++op) {
    const WorkerId w = rng() % 4;
    // Chains share their first blocks often (a few dozen prefixes), so blocks have several holders.
    const auto c = chain(rng() % (op < 2000 ? 40 : 4000), 1 + rng() % 24);
    idx.record(w, c);
    for (std::size_t i = c.size(); i-- > 0;) {
      lru[w].remove(c[i]);
      lru[w].push_front(c[i]);
    }
    while (lru[w].size() > kCapacity) lru[w].pop_back();
    if (op % 500 == 499) {
      for (WorkerId v = 0; v < 4; ++v) {
        const auto got = idx.worker_hashes(v);
        ASSERT_EQ(std::vector<BlockHash>(got.begin(), got.end()), std::vector<BlockHash>(lru[v].begin(), lru[v].end()))
            << "worker " << v << " after op " << op;
      }
    }
  }
  EXPECT_GT(idx.distinct_blocks(), 1500u);  // past the table's first size (1,024 slots) several times over
  std::size_t total = 0;
  for (const auto& l : lru) total += l.size();
  EXPECT_EQ(idx.entries(), total);
}

// The product's bound: at most 40 bytes per (block, worker) entry, the block table included, wherever blocks have
// two or more holders on average (kvroute-routing-bench, BM_IndexMemory, measures the same on a fleet-like fill).
// Checked at sizes across a whole growth of the table, blocks held by 2-3 workers each.
TEST(PrefixIndex, AnEntryTakesAtMost40BytesWithItsShareOfTheTable) {
  PrefixIndex idx;
  std::mt19937_64 rng(5);
  std::uint64_t block = 0;
  for (std::size_t target = 50'000; target <= 400'000; target += 25'000) {
    while (idx.entries() < target) {
      const BlockHash h = rng();
      const std::size_t holders = 2 + (block++ % 2);
      for (std::size_t k = 0; k < holders; ++k) idx.store(static_cast<WorkerId>((block + k) % 64), {&h, 1}, Tier::kGpu);
    }
    const double per_entry = static_cast<double>(idx.memory_bytes()) / static_cast<double>(idx.entries());
    EXPECT_LE(per_entry, 40.0) << idx.entries() << " entries on " << idx.distinct_blocks() << " blocks";
  }
}

TEST(PrefixIndex, ConcurrentReadersAndWriters) {
  PrefixIndex idx;
  idx.set_capacity(0, 5000);
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (std::uint64_t i = 0; i < 2000; ++i) idx.record(i % 4, chain(i % 300, 32));
    stop = true;
  });
  std::thread reader([&] {
    PrefixIndex::Match m;
    while (!stop) idx.match(chain(5, 32), m);
  });
  writer.join();
  reader.join();
  EXPECT_GT(idx.entries(), 0u);
}

}  // namespace
}  // namespace kvroute::hashing
