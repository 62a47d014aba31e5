#include "bench/mooncake.h"

#include <gtest/gtest.h>

namespace kvroute::bench {
namespace {

TEST(MooncakeTrace, ParsesFieldsAndSortsByTime) {
  const std::string text =
      "{\"timestamp\": 1500, \"input_length\": 1100, \"output_length\": 20, \"hash_ids\": [0, 1, 2]}\n"
      "\n"
      "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 0, \"hash_ids\": [0, 5], \"session_id\": \"s1\"}\n";
  auto w = parse_mooncake_trace(text, "t.jsonl", {});
  ASSERT_TRUE(w) << w.error().message;
  ASSERT_EQ(w->requests.size(), 2u);
  EXPECT_DOUBLE_EQ(w->requests[0].arrival_s, 0.0);
  EXPECT_DOUBLE_EQ(w->requests[1].arrival_s, 1.5);
  EXPECT_EQ(w->requests[0].id, 0u);
  EXPECT_EQ(w->requests[0].prompt_tokens, 600u);
  EXPECT_EQ(w->requests[0].output_tokens, 1u);  // an engine always generates the first token
  EXPECT_NE(w->requests[0].session, 0u);
  EXPECT_EQ(w->requests[1].session, 0u);
  EXPECT_TRUE(w->has_sessions);
  EXPECT_EQ(w->requests[1].chain.hashes.size(), 1100u / 16);
  EXPECT_EQ(w->requests[1].chain.total_units, 1100u);
}

TEST(MooncakeTrace, MalformedLinesNameTheLine) {
  struct Case {
    std::string line, expect;
  } cases[] = {
      {"{\"timestamp\": 0, \"input_length\": 10", "line 2: not valid JSON"},
      {"[1, 2]", "line 2: expected a JSON object"},
      {"{\"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}", "line 2: missing 'timestamp'"},
      {"{\"timestamp\": 0, \"output_length\": 1, \"hash_ids\": [1]}", "line 2: missing 'input_length'"},
      {"{\"timestamp\": 0, \"input_length\": -4, \"output_length\": 1, \"hash_ids\": [1]}", "line 2: 'input_length'"},
      {"{\"timestamp\": 0, \"input_length\": 4, \"output_length\": 1, \"hash_ids\": 7}", "line 2: 'hash_ids' must be"},
      {"{\"timestamp\": 0, \"input_length\": 4, \"output_length\": 1, \"hash_ids\": [\"a\"]}", "line 2: 'hash_ids'"},
      {"{\"timestamp\": \"x\", \"input_length\": 4, \"output_length\": 1, \"hash_ids\": [1]}", "line 2: 'timestamp'"},
  };
  for (const auto& c : cases) {
    const std::string text = "{\"timestamp\": 0, \"input_length\": 16, \"output_length\": 1, \"hash_ids\": [1]}\n" + c.line;
    auto w = parse_mooncake_trace(text, "bad.jsonl", {});
    ASSERT_FALSE(w) << c.line;
    EXPECT_NE(w.error().message.find("bad.jsonl " + c.expect), std::string::npos) << w.error().message;
  }
}

TEST(MooncakeTrace, MissingFileIsAnError) {
  auto w = read_mooncake_trace("/nonexistent/trace.jsonl", {});
  ASSERT_FALSE(w);
  EXPECT_NE(w.error().message.find("cannot open trace"), std::string::npos);
}

TEST(MooncakeTrace, MaxRequestsKeepsTheFirst) {
  std::string text;
  for (int i = 0; i < 10; ++i)
    text += "{\"timestamp\": " + std::to_string(i * 100) + ", \"input_length\": 512, \"output_length\": 5, \"hash_ids\": [" +
            std::to_string(i) + "]}\n";
  auto w = parse_mooncake_trace(text, "t", MooncakeOptions{"m", 4});
  ASSERT_TRUE(w);
  EXPECT_EQ(w->requests.size(), 4u);
  EXPECT_DOUBLE_EQ(w->requests.back().arrival_s, 0.3);
}

TEST(HashIdExpansion, SharedIdsGiveSharedBlocks) {
  const std::uint64_t root = hashing::namespace_root("m", "");
  auto a = expand_hash_ids(root, {7, 8, 9}, 3 * 512, 1);
  auto b = expand_hash_ids(root, {7, 8, 10}, 3 * 512, 2);
  auto c = expand_hash_ids(root, {6, 8, 9}, 3 * 512, 3);
  ASSERT_EQ(a.hashes.size(), 96u);
  ASSERT_EQ(b.hashes.size(), 96u);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(a.hashes[i], b.hashes[i]) << i;
  for (int i = 64; i < 96; ++i) EXPECT_NE(a.hashes[i], b.hashes[i]) << i;
  // A different first id changes everything after it, even where later ids agree (prefix semantics).
  for (int i = 0; i < 96; ++i) EXPECT_NE(a.hashes[i], c.hashes[i]) << i;
  // Deterministic.
  EXPECT_EQ(expand_hash_ids(root, {7, 8, 9}, 3 * 512, 99).hashes, a.hashes);
}

TEST(HashIdExpansion, PartialLastBlockContributesItsFullBlocks) {
  const std::uint64_t root = hashing::namespace_root("m", "");
  // 512 + 100 tokens: 32 blocks of id 1, then 6 full 16-token blocks of id 2 (96 tokens); 4 tokens unhashed.
  auto a = expand_hash_ids(root, {1, 2}, 612, 1);
  EXPECT_EQ(a.hashes.size(), 38u);
  EXPECT_EQ(a.total_units, 612u);
  auto full = expand_hash_ids(root, {1, 2}, 1024, 2);
  for (int i = 0; i < 38; ++i) EXPECT_EQ(a.hashes[i], full.hashes[i]);
}

TEST(HashIdExpansion, TokensBeyondTheIdsAreUniqueToTheRequest) {
  const std::uint64_t root = hashing::namespace_root("m", "");
  auto a = expand_hash_ids(root, {1}, 1024, 1);
  auto b = expand_hash_ids(root, {1}, 1024, 2);
  ASSERT_EQ(a.hashes.size(), 64u);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(a.hashes[i], b.hashes[i]);
  for (int i = 32; i < 64; ++i) EXPECT_NE(a.hashes[i], b.hashes[i]);
  // Fewer tokens than the ids cover: only the tokens count.
  EXPECT_EQ(expand_hash_ids(root, {1, 2, 3}, 40, 1).hashes.size(), 2u);
}

}  // namespace
}  // namespace kvroute::bench
