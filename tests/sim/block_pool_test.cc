// BlockPool: reference counts, LRU free queue with tail-first release, eviction events, CPU tier.
#include "backends/sim/internal/block_pool.h"

#include <set>
#include <string>

#include <gtest/gtest.h>

namespace kvroute::sim::internal {
namespace {

// Records every event as a string, and mirrors the cache as sets per medium.
struct Recorder : EngineSink {
  std::vector<std::string> log;
  std::set<std::uint64_t> gpu, cpu;
  void on_blocks_stored(std::span<const std::uint64_t> hashes, std::optional<std::uint64_t> parent, std::uint64_t,
                        std::uint32_t, Medium m, double) override {
    for (auto h : hashes) {
      log.push_back(std::string("+") + medium_name(m) + std::to_string(h));
      (m == Medium::kGpu ? gpu : cpu).insert(h);
    }
  }
  void on_blocks_removed(std::span<const std::uint64_t> hashes, Medium m, double) override {
    for (auto h : hashes) {
      log.push_back(std::string("-") + medium_name(m) + std::to_string(h));
      (m == Medium::kGpu ? gpu : cpu).erase(h);
    }
  }
  void on_all_cleared(double) override {
    log.push_back("clear");
    gpu.clear();
    cpu.clear();
  }
};

std::vector<BlockId> take(BlockPool& p, std::uint32_t n, Recorder& r) {
  std::vector<BlockId> out;
  p.allocate(n, out, r, 0);
  return out;
}

TEST(BlockPool, ReferenceCountsAndSharing) {
  BlockPool p(4, 0);
  Recorder r;
  auto a = take(p, 2, r);
  EXPECT_EQ(p.num_free(), 2u);
  ASSERT_TRUE(p.register_hash(a[0], 100, std::nullopt, 1, 0));
  ASSERT_TRUE(p.register_hash(a[1], 101, 100, 1, 1));
  EXPECT_EQ(p.lookup_gpu(100), a[0]);
  // A second request shares block 100: two references, and it stays out of the free queue until both go.
  p.acquire(a[0]);
  EXPECT_EQ(p.ref_count(a[0]), 2u);
  p.release(a);
  EXPECT_EQ(p.ref_count(a[0]), 1u);
  EXPECT_EQ(p.num_free(), 3u);
  p.release(std::vector<BlockId>{a[0]});
  EXPECT_EQ(p.num_free(), 4u);
  // Freed blocks keep their hashes: a later request can still hit them, which takes them off the queue.
  EXPECT_EQ(p.lookup_gpu(101), a[1]);
  p.acquire(a[1]);
  EXPECT_EQ(p.num_free(), 3u);
  EXPECT_TRUE(r.log.empty());
}

TEST(BlockPool, DuplicateHashIsNotCachedTwice) {
  BlockPool p(4, 0);
  Recorder r;
  auto a = take(p, 2, r);
  EXPECT_TRUE(p.register_hash(a[0], 7, std::nullopt, 1, 0));
  EXPECT_FALSE(p.register_hash(a[1], 7, std::nullopt, 2, 0));
  EXPECT_EQ(p.num_gpu_cached(), 1u);
  EXPECT_EQ(p.lookup_gpu(7), a[0]);
}

TEST(BlockPool, FinishedRequestsTailIsEvictedFirst) {
  BlockPool p(6, 0);
  Recorder r;
  auto a = take(p, 3, r);  // blocks 0, 1, 2 for a request's chain 10 -> 11 -> 12
  for (std::uint32_t i = 0; i < 3; ++i)
    p.register_hash(a[i], 10 + i, i ? std::optional<std::uint64_t>(9 + i) : std::nullopt, 1, i);
  for (std::uint64_t h : {10ull, 11ull, 12ull}) r.gpu.insert(h);  // the engine reports these stores
  p.release(a);
  // Never-used blocks first, then the request's blocks from its tail to its head.
  EXPECT_EQ(p.free_queue(), (std::vector<BlockId>{3, 4, 5, a[2], a[1], a[0]}));
  auto b = take(p, 4, r);  // three never-used blocks, then the tail block (hash 12)
  EXPECT_EQ(r.log, (std::vector<std::string>{"-GPU12"}));
  EXPECT_EQ(p.lookup_gpu(12), kNoBlock);
  EXPECT_EQ(p.lookup_gpu(11), a[1]);
  EXPECT_EQ(p.gpu_evictions(), 1u);
  EXPECT_EQ(r.gpu, (std::set<std::uint64_t>{10, 11}));
  EXPECT_EQ(p.gpu_hashes(), (std::vector<std::uint64_t>{10, 11}));
}

TEST(BlockPool, CpuTierTakesEvictedBlocksInLruOrder) {
  BlockPool p(2, 2);
  Recorder r;
  auto a = take(p, 2, r);
  p.register_hash(a[0], 1, std::nullopt, 1, 0);
  p.register_hash(a[1], 2, 1, 1, 1);
  r.gpu = {1, 2};
  p.release(a);  // queue: block(2), block(1)
  auto b = take(p, 2, r);
  EXPECT_EQ(r.log, (std::vector<std::string>{"-GPU2", "+CPU2", "-GPU1", "+CPU1"}));
  EXPECT_TRUE(p.contains_cpu(1));
  EXPECT_TRUE(p.contains_cpu(2));
  // Touch 2 so that 1 is the CPU tier's least recently used; the next eviction then drops 1.
  p.touch_cpu(2);
  p.register_hash(b[0], 3, std::nullopt, 2, 0);
  r.gpu.insert(3);
  p.release(std::vector<BlockId>{b[0]});
  r.log.clear();
  auto c = take(p, 1, r);
  EXPECT_EQ(r.log, (std::vector<std::string>{"-GPU3", "-CPU1", "+CPU3"}));
  EXPECT_EQ(p.cpu_hashes(), (std::vector<std::uint64_t>{2, 3}));
  EXPECT_EQ(p.cpu_evictions(), 1u);
  EXPECT_EQ(r.cpu, (std::set<std::uint64_t>{2, 3}));
  EXPECT_TRUE(r.gpu.empty());
}

TEST(BlockPool, ClearRefusesWhileBlocksAreInUse) {
  BlockPool p(2, 1);
  Recorder r;
  auto a = take(p, 1, r);
  p.register_hash(a[0], 5, std::nullopt, 1, 0);
  EXPECT_FALSE(p.clear(r, 0));
  p.release(a);
  EXPECT_TRUE(p.clear(r, 0));
  EXPECT_EQ(r.log.back(), "clear");
  EXPECT_EQ(p.num_gpu_cached(), 0u);
  EXPECT_EQ(p.lookup_gpu(5), kNoBlock);
}

}  // namespace
}  // namespace kvroute::sim::internal
