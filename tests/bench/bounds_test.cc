#include "bench/bounds.h"

#include <gtest/gtest.h>

#include "bench/mooncake.h"

namespace kvroute::bench {
namespace {

Workload hand_made(const std::vector<std::vector<std::uint64_t>>& ids, std::uint32_t tokens_per_request) {
  std::string text;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    std::string list;
    for (auto id : ids[i]) list += (list.empty() ? "" : ",") + std::to_string(id);
    text += "{\"timestamp\": " + std::to_string(i) + ", \"input_length\": " + std::to_string(tokens_per_request) +
            ", \"output_length\": 1, \"hash_ids\": [" + list + "]}\n";
  }
  auto w = parse_mooncake_trace(text, "hand", {});
  EXPECT_TRUE(w);
  return std::move(*w);
}

TEST(Bounds, ServableTokensNeverIncludeTheLastToken) {
  EXPECT_EQ(servable_cached_tokens(4, 64), 48u);   // fully cached 64-token prompt: the last block is recomputed
  EXPECT_EQ(servable_cached_tokens(4, 65), 64u);
  EXPECT_EQ(servable_cached_tokens(2, 100), 32u);
  EXPECT_EQ(servable_cached_tokens(0, 100), 0u);
}

TEST(Bounds, UpperBoundCountsEveryPrefixSeenBefore) {
  // Three 1024-token requests (2 ids each = 64 blocks): [1,2] [1,2] [1,3].
  Workload w = hand_made({{1, 2}, {1, 2}, {1, 3}}, 1024);
  // Request 2 hits 63 blocks (the last is recomputed) = 1008 tokens; request 3 hits id 1 = 512 tokens.
  EXPECT_NEAR(upper_bound_hit_rate(w), (1008.0 + 512.0) / 3072.0, 1e-12);
}

TEST(Bounds, CapacityBoundEvictsLeastRecentlyUsed) {
  // Capacity of 64 blocks = one 1024-token request. [1,2] then [3,4] evicts it, so [1,2] misses again.
  Workload w = hand_made({{1, 2}, {3, 4}, {1, 2}}, 1024);
  EXPECT_NEAR(capacity_bound_hit_rate(w, 64), 0.0, 1e-12);
  // With room for two requests the third hits fully.
  EXPECT_NEAR(capacity_bound_hit_rate(w, 128), 1008.0 / 3072.0, 1e-12);
  // Infinite capacity equals the upper bound.
  EXPECT_NEAR(capacity_bound_hit_rate(w, 1u << 20), upper_bound_hit_rate(w), 1e-12);
}

TEST(Bounds, TailFirstOrderKeepsSharedPrefixes) {
  // 96-block capacity. [1,2] then [1,3] fill it (id 1 shared). [4] (32 blocks) must evict 32: the least
  // recently used are the tail blocks of [1,2] (id 2), not the shared id-1 prefix, so [1,3] then hits fully.
  auto x = parse_mooncake_trace(
      "{\"timestamp\": 0, \"input_length\": 1024, \"output_length\": 1, \"hash_ids\": [1, 2]}\n"
      "{\"timestamp\": 1, \"input_length\": 1024, \"output_length\": 1, \"hash_ids\": [1, 3]}\n"
      "{\"timestamp\": 2, \"input_length\": 512, \"output_length\": 1, \"hash_ids\": [4]}\n"
      "{\"timestamp\": 3, \"input_length\": 1024, \"output_length\": 1, \"hash_ids\": [1, 3]}\n",
      "t", {});
  ASSERT_TRUE(x);
  // Hits: request 2: 512 (id 1); request 4: 1008 (all but the last block).
  EXPECT_NEAR(capacity_bound_hit_rate(*x, 96), (512.0 + 1008.0) / 3584.0, 1e-12);
}

}  // namespace
}  // namespace kvroute::bench
