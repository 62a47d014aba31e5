#include "bench/generators.h"

#include <gtest/gtest.h>

#include <set>

namespace kvroute::bench {
namespace {

TEST(Generators, DeterministicForASeed) {
  for (const auto& name : generator_names()) {
    auto a = generate_workload(name, {.seed = 3, .requests = 200});
    auto b = generate_workload(name, {.seed = 3, .requests = 200});
    auto c = generate_workload(name, {.seed = 4, .requests = 200});
    ASSERT_TRUE(a && b && c) << name;
    ASSERT_EQ(a->requests.size(), 200u) << name;
    bool differs = false;
    for (std::size_t i = 0; i < a->requests.size(); ++i) {
      const Request& x = a->requests[i];
      const Request& y = b->requests[i];
      EXPECT_EQ(x.arrival_s, y.arrival_s);
      EXPECT_EQ(x.prompt_tokens, y.prompt_tokens);
      EXPECT_EQ(x.output_tokens, y.output_tokens);
      EXPECT_EQ(x.chain.hashes, y.chain.hashes);
      EXPECT_EQ(x.output_blocks, y.output_blocks);
      EXPECT_EQ(x.session, y.session);
      EXPECT_EQ(x.chain.hashes.size(), x.prompt_tokens / 16);
      if (x.chain.hashes != c->requests[i].chain.hashes || x.arrival_s != c->requests[i].arrival_s) differs = true;
      if (i > 0) {
        EXPECT_LE(a->requests[i - 1].arrival_s, x.arrival_s);
      }
    }
    EXPECT_TRUE(differs) << name << ": another seed should give another workload";
  }
}

TEST(Generators, UnknownNameListsValidOnes) {
  auto w = generate_workload("nope", {});
  ASSERT_FALSE(w);
  EXPECT_NE(w.error().message.find("multi_turn"), std::string::npos);
}

TEST(Generators, SharedPrefixGroupsShareTheirFirstBlocks) {
  auto w = generate_workload("shared_prefix", {.seed = 1, .requests = 300});
  ASSERT_TRUE(w);
  std::set<std::uint64_t> first;
  for (const auto& r : w->requests) first.insert(r.chain.hashes.at(0));
  EXPECT_GT(first.size(), 5u);
  EXPECT_LT(first.size(), 100u);
}

TEST(Generators, MultiTurnExtendsThePreviousTurn) {
  auto w = generate_workload("multi_turn", {.seed = 1, .requests = 300});
  ASSERT_TRUE(w);
  EXPECT_TRUE(w->has_sessions);
  // The second turn of a session starts with the first turn's prompt and the answer the engine produced.
  const Request* first = nullptr;
  const Request* second = nullptr;
  for (const auto& r : w->requests) {
    if (r.session != w->requests[0].session) continue;
    (first ? second : first) = &r;
    if (second) break;
  }
  ASSERT_TRUE(first && second);
  std::vector<std::uint64_t> turn1 = first->chain.hashes;
  turn1.insert(turn1.end(), first->output_blocks.begin(), first->output_blocks.end());
  ASSERT_LE(turn1.size(), second->chain.hashes.size());
  for (std::size_t i = 0; i < turn1.size(); ++i) EXPECT_EQ(turn1[i], second->chain.hashes[i]) << i;
}

TEST(Generators, TenantsNeverShareBlocksAcrossNamespaces) {
  auto w = generate_workload("tenants", {.seed = 1, .requests = 400});
  ASSERT_TRUE(w);
  std::set<std::uint64_t> roots, first;
  for (const auto& r : w->requests) {
    roots.insert(r.chain.root);
    first.insert(r.chain.hashes.at(0));
  }
  EXPECT_GT(roots.size(), 5u);
  EXPECT_EQ(roots.size(), first.size());  // one system prompt per tenant namespace
}

TEST(Generators, ZipfIsSkewed) {
  SplitMix rng(5);
  Zipf z(100, 1.1);
  std::vector<int> counts(100);
  for (int i = 0; i < 20000; ++i) ++counts[z.sample(rng)];
  EXPECT_GT(counts[0], counts[9] * 5);
  EXPECT_GT(counts[9], counts[99]);
}

}  // namespace
}  // namespace kvroute::bench
