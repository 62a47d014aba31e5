// Applying KV events to the PrefixIndex under kvroute's own hashes: stored -> match, removed, cleared, the
// CPU tier, LoRA namespaces, engine block sizes, data-parallel ranks and the bounded hash map.
#include "backends/events/event_applier.h"

#include <gtest/gtest.h>

#include <numeric>

#include "hashing/block_chain.h"

namespace kvroute::events {
namespace {

using hashing::PrefixIndex;
using hashing::WorkerId;

constexpr WorkerId kW = 1;

std::vector<std::uint32_t> tokens(std::size_t n, std::uint32_t start = 100) {
  std::vector<std::uint32_t> t(n);
  std::iota(t.begin(), t.end(), start);
  return t;
}

std::span<const std::uint32_t> slice(const std::vector<std::uint32_t>& t, std::size_t from, std::size_t n) {
  return std::span<const std::uint32_t>(t).subspan(from, n);
}

// The router's view of a prompt: its own chain over the token ids.
std::vector<hashing::BlockHash> chain(const std::vector<std::uint32_t>& t, std::string_view ns = "m") {
  return hashing::hash_tokens(hashing::namespace_root(ns, ""), t).hashes;
}

std::uint32_t matched(const PrefixIndex& index, const std::vector<hashing::BlockHash>& c, WorkerId w = kW) {
  PrefixIndex::Match m;
  index.match(c, m);
  return m.of(w);
}

std::uint32_t matched_cpu(const PrefixIndex& index, const std::vector<hashing::BlockHash>& c, WorkerId w = kW) {
  PrefixIndex::Match m;
  index.match(c, m);
  return m.cpu_of(w);
}

class ApplierTest : public ::testing::Test {
 protected:
  PrefixIndex index;
  KvEventApplier applier{index, applier_options(kW, "m")};
  std::vector<std::uint32_t> t = tokens(64);  // four 16-token blocks

  // Engine hashes 101..104 for the four blocks, stored in two events chained through the parent.
  void store_all(Medium m = Medium::kGpu) {
    KvEventBatch b;
    const std::uint64_t h1[] = {101, 102};
    const std::uint64_t h2[] = {103, 104};
    b.add_stored(h1, std::nullopt, slice(t, 0, 32), 16, m);
    b.add_stored(h2, 102, slice(t, 32, 32), 16, m);
    applier.apply(b);
  }
  void remove(std::vector<std::uint64_t> hs, Medium m = Medium::kGpu) {
    KvEventBatch b;
    b.add_removed(hs, m);
    applier.apply(b);
  }
};

TEST_F(ApplierTest, StoredBlocksMatchTheRoutersOwnChain) {
  store_all();
  EXPECT_EQ(matched(index, chain(t)), 4u);
  EXPECT_EQ(matched_cpu(index, chain(t)), 0u);
  EXPECT_EQ(index.worker_blocks(kW), 4u);
  // A different namespace shares nothing.
  EXPECT_EQ(matched(index, chain(t, "other-model")), 0u);
  const ApplierStats s = applier.stats();
  EXPECT_EQ(s.blocks_stored, 4u);
  EXPECT_EQ(s.events, 2u);
  EXPECT_EQ(s.mapped_blocks, 4u);
}

TEST_F(ApplierTest, RemovedBlocksAreDroppedThroughTheHashMap) {
  store_all();
  remove({104});
  EXPECT_EQ(matched(index, chain(t)), 3u);
  remove({102});
  EXPECT_EQ(matched(index, chain(t)), 1u);  // block 2 gone: the prefix stops there
  EXPECT_EQ(index.worker_blocks(kW), 2u);
  remove({999});
  EXPECT_EQ(applier.stats().unknown_removals, 1u);
  EXPECT_EQ(applier.stats().mapped_blocks, 2u);
}

TEST_F(ApplierTest, AllBlocksClearedEmptiesTheWorkerAndTheMap) {
  store_all();
  PrefixIndex::Match m;
  KvEventBatch b;
  b.add_cleared();
  applier.apply(b);
  EXPECT_EQ(index.worker_blocks(kW), 0u);
  EXPECT_EQ(applier.stats().mapped_blocks, 0u);
  EXPECT_EQ(applier.stats().clears, 1u);
  // The old parent is forgotten: a child of it is an orphan, not a wrong entry.
  KvEventBatch c;
  const std::uint64_t h[] = {105};
  c.add_stored(h, 104, slice(t, 0, 16), 16);
  applier.apply(c);
  EXPECT_EQ(applier.stats().orphan_events, 1u);
  EXPECT_EQ(index.worker_blocks(kW), 0u);
}

TEST_F(ApplierTest, CpuTierAndCopiesOnBothMedia) {
  store_all(Medium::kCpu);
  EXPECT_EQ(matched(index, chain(t)), 4u);
  EXPECT_EQ(matched_cpu(index, chain(t)), 4u);
  // A GPU copy of block 1 appears: GPU wins while it exists.
  KvEventBatch b;
  const std::uint64_t h[] = {101};
  b.add_stored(h, std::nullopt, slice(t, 0, 16), 16, Medium::kGpu);
  applier.apply(b);
  EXPECT_EQ(matched_cpu(index, chain(t)), 3u);
  remove({101}, Medium::kGpu);  // GPU copy evicted: back to the CPU tier, still held
  EXPECT_EQ(matched(index, chain(t)), 4u);
  EXPECT_EQ(matched_cpu(index, chain(t)), 4u);
  remove({101}, Medium::kCpu);
  EXPECT_EQ(matched(index, chain(t)), 0u);
  EXPECT_EQ(index.worker_blocks(kW), 3u);
}

TEST_F(ApplierTest, RestoringARemovedBlockOnAnotherMediumKeepsItsParentLink) {
  store_all();
  remove({103, 104});
  KvEventBatch b;
  const std::uint64_t h[] = {103};
  b.add_stored(h, 102, slice(t, 32, 16), 16, Medium::kCpu);
  applier.apply(b);
  EXPECT_EQ(matched(index, chain(t)), 3u);
  EXPECT_EQ(matched_cpu(index, chain(t)), 1u);
}

TEST_F(ApplierTest, LoraNameSelectsTheNamespace) {
  KvEventBatch b;
  const std::uint64_t h[] = {7, 8};
  b.add_stored(h, std::nullopt, slice(t, 0, 32), 16, Medium::kGpu, "sql-adapter");
  applier.apply(b);
  EXPECT_EQ(matched(index, chain(t)), 0u);
  EXPECT_EQ(matched(index, chain(t, "sql-adapter")), 2u);
  EXPECT_EQ(applier.root_for("sql-adapter"), hashing::namespace_root("sql-adapter", ""));
}

TEST_F(ApplierTest, OtherMediumAndOtherGroupAreNotApplied) {
  KvEventBatch b;
  const std::uint64_t h[] = {7};
  b.add_stored(h, std::nullopt, slice(t, 0, 16), 16, Medium::kOther);
  b.add_stored(h, std::nullopt, slice(t, 0, 16), 16).group_idx = 1;
  applier.apply(b);
  EXPECT_EQ(index.worker_blocks(kW), 0u);
  EXPECT_EQ(applier.stats().unsupported_events, 2u);
}

TEST(Applier, LargerEngineBlocksSplitIntoRouterBlocks) {
  PrefixIndex index;
  KvEventApplier applier(index, applier_options(kW, "m"));
  auto t = tokens(128);
  KvEventBatch b;
  const std::uint64_t h1[] = {1, 2};  // two 32-token engine blocks = four router blocks
  const std::uint64_t h2[] = {3};
  b.add_stored(h1, std::nullopt, slice(t, 0, 64), 32);
  b.add_stored(h2, 2, slice(t, 64, 32), 32);
  applier.apply(b);
  EXPECT_EQ(matched(index, chain(t)), 6u);
  KvEventBatch r;
  const std::uint64_t rm[] = {2};
  r.add_removed(rm);
  applier.apply(r);
  EXPECT_EQ(matched(index, chain(t)), 2u);
  EXPECT_EQ(index.worker_blocks(kW), 4u);  // engine block 2's two router blocks are both gone
}

TEST(Applier, IncompatibleBlockSizesAreCountedAndSkipped) {
  PrefixIndex index;
  KvEventApplier applier(index, applier_options(kW, "m"));
  auto t = tokens(24);
  KvEventBatch b;
  const std::uint64_t h[] = {1};
  b.add_stored(h, std::nullopt, slice(t, 0, 24), 24);
  applier.apply(b);
  EXPECT_EQ(index.worker_blocks(kW), 0u);
  EXPECT_EQ(applier.stats().unsupported_events, 1u);
}

TEST(Applier, DataParallelRanksHoldBlocksIndependently) {
  PrefixIndex index;
  KvEventApplier applier(index, applier_options(kW, "m", 2));
  auto t = tokens(32);
  KvEventBatch b0, b1;
  const std::uint64_t r0[] = {11, 12};
  const std::uint64_t r1[] = {21};  // rank 1 has the first block only, under its own engine hash
  b0.add_stored(r0, std::nullopt, slice(t, 0, 32), 16);
  b1.add_stored(r1, std::nullopt, slice(t, 0, 16), 16);
  applier.apply(b0, 0);
  applier.apply(b1, 1);
  EXPECT_EQ(matched(index, chain(t)), 2u);
  KvEventBatch rm;
  const std::uint64_t h[] = {11};
  rm.add_removed(h);
  applier.apply(rm, 0);  // rank 1 still holds the first block
  EXPECT_EQ(matched(index, chain(t)), 2u);
  applier.reset_rank(1);
  EXPECT_EQ(matched(index, chain(t)), 0u);
  EXPECT_EQ(index.worker_blocks(kW), 1u);  // rank 0's second block remains
  EXPECT_EQ(applier.stats().resets, 1u);
}

TEST(Applier, TheHashMapIsBounded) {
  PrefixIndex index;
  KvEventApplier applier(index, applier_options(kW, "m", 1, 4));
  auto t = tokens(16 * 6);
  KvEventBatch b;
  const std::uint64_t h[] = {1, 2, 3, 4, 5, 6};
  b.add_stored(h, std::nullopt, t, 16);
  applier.apply(b);
  EXPECT_EQ(applier.stats().overflow_resets, 1u);
  EXPECT_EQ(applier.stats().mapped_blocks, 0u);
  EXPECT_EQ(index.worker_blocks(kW), 0u);
}

TEST(Applier, OtherWorkersAreUntouched) {
  PrefixIndex index;
  KvEventApplier a(index, applier_options(1, "m"));
  KvEventApplier c(index, applier_options(2, "m"));
  auto t = tokens(32);
  KvEventBatch b;
  const std::uint64_t h[] = {1, 2};
  b.add_stored(h, std::nullopt, t, 16);
  a.apply(b);
  c.apply(b);
  KvEventBatch clr;
  clr.add_cleared();
  a.apply(clr);
  EXPECT_EQ(matched(index, chain(t), 1), 0u);
  EXPECT_EQ(matched(index, chain(t), 2), 2u);
}

}  // namespace
}  // namespace kvroute::events
