// router::CachePools: one shared cache per pool of workers that can hold the same blocks.
#include "router/cache_pools.h"

#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace kvroute::router {
namespace {

using Models = std::vector<std::vector<std::string>>;

TEST(GroupByModels, WorkersOfDisjointModelsArePoolsOfTheirOwn) {
  EXPECT_EQ(group_by_models(Models{{"qwen"}, {"llama"}, {"qwen"}, {"llama"}}), (std::vector<std::size_t>{0, 1, 0, 1}));
  EXPECT_EQ(group_by_models(Models{}), std::vector<std::size_t>{});
}

TEST(GroupByModels, AdaptersShareTheirBaseModelsPool) {
  // A LoRA adapter loaded on some workers of a base model: the engine holds it in the same KV pool.
  EXPECT_EQ(group_by_models(Models{{"qwen", "sql"}, {"qwen"}, {"llama"}, {"qwen", "chat"}}),
            (std::vector<std::size_t>{0, 0, 2, 0}));
}

TEST(GroupByModels, SharedIdsJoinTransitively) {
  // 0 and 2 share nothing, but both share an id with 1.
  EXPECT_EQ(group_by_models(Models{{"a"}, {"a", "b"}, {"b"}, {"c"}}), (std::vector<std::size_t>{0, 0, 0, 3}));
  EXPECT_EQ(group_by_models(Models{{"c"}, {"b"}, {"a"}, {"a", "b", "c"}}), (std::vector<std::size_t>{0, 0, 0, 0}));
}

TEST(GroupByModels, AWorkerOfUnknownModelsJoinsEveryone) {
  // Until its /v1/models is read a worker is routed any model, so its blocks may be any model's.
  EXPECT_EQ(group_by_models(Models{{"qwen"}, {"llama"}, {}}), (std::vector<std::size_t>{0, 0, 0}));
}

class CachePoolsTest : public testing::Test {
 protected:
  std::shared_ptr<backends::Worker> add(std::vector<std::string> models) {
    const auto id = static_cast<hashing::WorkerId>(workers_.size());
    backends::WorkerEndpoint e;
    e.name = "w" + std::to_string(id);
    auto w = std::make_shared<backends::Worker>(id, e, ++serial_);
    w->set_models(std::move(models));
    workers_.push_back(w);
    capacity_.push_back(0);
    return w;
  }
  static std::vector<hashing::BlockHash> chain(hashing::BlockHash first, std::size_t n) {
    std::vector<hashing::BlockHash> c;
    for (std::size_t i = 0; i < n; ++i) c.push_back(first * 1000003 + i * 7919 + 1);
    return c;
  }

  backends::WorkerList workers_;
  std::vector<std::uint64_t> capacity_;
  std::uint64_t serial_ = 0;
  CachePools pools_;
};

TEST_F(CachePoolsTest, EachPoolIsMeasuredAgainstItsOwnCapacity) {
  add({"qwen"});
  add({"llama"});
  capacity_ = {100, 300};
  // 60 blocks, then another 60, then the first again: a 100-block pool holds only the first chain's leading
  // 40 blocks (the second chain evicted its tail); one cache of the fleet's 400 blocks would hold all 60.
  const auto a = chain(1, 60), b = chain(2, 60);
  auto first = pools_.access(workers_, 0, capacity_, a);
  ASSERT_TRUE(first);
  EXPECT_EQ(first->blocks, 0u);
  EXPECT_TRUE(first->resized);
  EXPECT_EQ(pools_.access(workers_, 0, capacity_, b)->blocks, 0u);
  EXPECT_EQ(pools_.access(workers_, 0, capacity_, a)->blocks, 40u);
  // The llama pool has room for both.
  EXPECT_EQ(pools_.access(workers_, 1, capacity_, a)->blocks, 0u);
  EXPECT_EQ(pools_.access(workers_, 1, capacity_, b)->blocks, 0u);
  auto again = pools_.access(workers_, 1, capacity_, a);
  EXPECT_EQ(again->blocks, 60u);
  EXPECT_FALSE(again->resized);
  EXPECT_NE(first->pool, again->pool);

  pools_.count(first->pool, 10, 20);
  pools_.count(again->pool, 900, 960);
  pools_.count(12345, 1, 1);  // a pool that is gone: ignored
  const auto info = pools_.pools();
  ASSERT_EQ(info.size(), 2u);
  EXPECT_EQ(info[0].workers, std::vector<std::string>{"w0"});
  EXPECT_EQ(info[0].models, std::vector<std::string>{"qwen"});
  EXPECT_EQ(info[0].capacity_blocks, 100u);
  EXPECT_EQ(info[0].hit_tokens_workers, 10u);
  EXPECT_EQ(info[0].hit_tokens_shared, 20u);
  EXPECT_EQ(info[1].workers, std::vector<std::string>{"w1"});
  EXPECT_EQ(info[1].capacity_blocks, 300u);
  EXPECT_EQ(info[1].entries, 120u);
  EXPECT_EQ(info[1].hit_tokens_workers, 900u);
  EXPECT_EQ(pools_.capacity_blocks(), 400u);
  EXPECT_EQ(pools_.sample_rate(), 1.0);
}

TEST_F(CachePoolsTest, APoolKeepsItsCacheAsWorkersJoinAndLeave) {
  add({"qwen"});
  capacity_ = {100};
  const auto a = chain(1, 50);
  ASSERT_EQ(pools_.access(workers_, 0, capacity_, a)->blocks, 0u);
  // A second qwen worker joins: the same pool, now twice the capacity, still holding the chain.
  add({"qwen", "sql"});
  capacity_[1] = 100;
  auto joined = pools_.access(workers_, 1, capacity_, a);
  ASSERT_TRUE(joined);
  EXPECT_EQ(joined->blocks, 50u);
  EXPECT_TRUE(joined->resized);
  ASSERT_EQ(pools_.pools().size(), 1u);
  EXPECT_EQ(pools_.pools()[0].workers, (std::vector<std::string>{"w0", "w1"}));
  EXPECT_EQ(pools_.pools()[0].models, (std::vector<std::string>{"qwen", "sql"}));
  EXPECT_EQ(pools_.capacity_blocks(), 200u);
  // An unhealthy worker's capacity leaves the pool's; its models still join it.
  workers_[1]->set_healthy(false);
  EXPECT_EQ(pools_.access(workers_, 0, capacity_, a)->blocks, 50u);
  EXPECT_EQ(pools_.capacity_blocks(), 100u);
  // The first worker now serves another model: the pools split, and the second worker's pool starts empty.
  workers_[1]->set_healthy(true);
  workers_[0]->set_models({"llama"});
  EXPECT_EQ(pools_.access(workers_, 0, capacity_, a)->blocks, 50u);
  EXPECT_EQ(pools_.access(workers_, 1, capacity_, a)->blocks, 0u);
  EXPECT_EQ(pools_.pools().size(), 2u);
}

TEST_F(CachePoolsTest, PoolsMergedByANewWorkerGetTheirCachesBackOnceItsModelsAreKnown) {
  add({"qwen"});
  add({"llama"});
  capacity_ = {100, 100};
  const auto a = chain(1, 50), b = chain(2, 50);
  ASSERT_EQ(pools_.access(workers_, 0, capacity_, a)->blocks, 0u);
  ASSERT_EQ(pools_.access(workers_, 1, capacity_, b)->blocks, 0u);
  // A worker whose models are not read yet may be sent any model: one pool of the three, under the oldest
  // worker's name, with the qwen pool's cache.
  add({});
  capacity_[2] = 100;
  auto merged = pools_.access(workers_, 1, capacity_, b);
  EXPECT_EQ(merged->blocks, 0u);  // the llama pool's blocks are not in the qwen pool's cache
  ASSERT_EQ(pools_.pools().size(), 1u);
  EXPECT_EQ(pools_.pools()[0].workers.size(), 3u);
  EXPECT_EQ(pools_.capacity_blocks(), 300u);
  // Its models are read: the llama pool splits off again, with its own cache back.
  workers_[2]->set_models({"qwen"});
  EXPECT_EQ(pools_.access(workers_, 1, capacity_, b)->blocks, 50u);
  EXPECT_EQ(pools_.access(workers_, 2, capacity_, a)->blocks, 50u);
  ASSERT_EQ(pools_.pools().size(), 2u);
  EXPECT_EQ(pools_.pools()[0].workers, (std::vector<std::string>{"w0", "w2"}));
  EXPECT_EQ(pools_.capacity_blocks(), 300u);
}

TEST_F(CachePoolsTest, NothingIsMeasuredWhileAPoolsCapacityIsUnknown) {
  add({"qwen"});
  add({"qwen"});
  add({"llama"});
  capacity_ = {100, 0, 100};
  EXPECT_FALSE(pools_.access(workers_, 0, capacity_, chain(1, 10)));
  // The llama pool's capacity is known, so it is measured.
  EXPECT_TRUE(pools_.access(workers_, 2, capacity_, chain(1, 10)));
  // An unhealthy worker's unknown capacity does not hold its pool back.
  workers_[1]->set_healthy(false);
  EXPECT_TRUE(pools_.access(workers_, 0, capacity_, chain(1, 10)));
}

}  // namespace
}  // namespace kvroute::router
