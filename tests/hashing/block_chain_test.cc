#include "hashing/block_chain.h"

#include <numeric>
#include <vector>

#include <gtest/gtest.h>

namespace kvroute::hashing {
namespace {

std::vector<std::uint32_t> iota_tokens(std::size_t n, std::uint32_t start = 0) {
  std::vector<std::uint32_t> t(n);
  std::iota(t.begin(), t.end(), start);
  return t;
}

// Golden vectors of docs/hashing.md (spec version 1). A change here is a change of the wire spec.
TEST(BlockChainGolden, NamespaceRoots) {
  EXPECT_EQ(namespace_root("", ""), 0x8af8828130daea83ull);
  EXPECT_EQ(namespace_root("qwen3-8b", ""), 0xd4b727b8c8ea7c79ull);
  EXPECT_EQ(namespace_root("qwen3-8b", "tenant-a"), 0x8a507c0af6138111ull);
}

TEST(BlockChainGolden, TokenChain) {
  const auto tokens = iota_tokens(40);  // 2 full blocks of 16, 8-token tail ignored
  const BlockChain c = hash_tokens(namespace_root("qwen3-8b", ""), tokens);
  ASSERT_EQ(c.hashes.size(), 2u);
  EXPECT_EQ(c.hashes[0], 0xc5d58a35844ffc03ull);
  EXPECT_EQ(c.hashes[1], 0x2a227f1193136002ull);
  EXPECT_EQ(c.total_units, 40u);
  EXPECT_EQ(c.estimated_tokens(), 40u);
}

TEST(BlockChainGolden, TextChain) {
  const std::string text(130, 'a');  // 2 full blocks of 64 bytes, 2-byte tail ignored
  const BlockChain c = hash_text(namespace_root("qwen3-8b", ""), text);
  ASSERT_EQ(c.hashes.size(), 2u);
  EXPECT_EQ(c.hashes[0], 0xc0f013a8a5baf68full);
  EXPECT_EQ(c.hashes[1], 0x6dff1fbe441932e0ull);
  EXPECT_EQ(c.estimated_tokens(), 33u);  // ceil(130 / 4)
}

TEST(BlockChain, ChainLinksAreSeededByParent) {
  const std::uint64_t root = namespace_root("m", "");
  const auto tokens = iota_tokens(32);
  const BlockChain c = hash_tokens(root, tokens);
  EXPECT_EQ(c.hashes[0], hash_block(root, tokens.data(), 64));
  EXPECT_EQ(c.hashes[1], hash_block(c.hashes[0], tokens.data() + 16, 64));
}

TEST(BlockChain, SharedPrefixSharesExactlyItsBlocks) {
  const std::uint64_t root = namespace_root("m", "");
  auto a = iota_tokens(64);
  auto b = a;
  b[40] = 999;  // differs inside block 2
  const BlockChain ca = hash_tokens(root, a), cb = hash_tokens(root, b);
  EXPECT_EQ(ca.hashes[0], cb.hashes[0]);
  EXPECT_EQ(ca.hashes[1], cb.hashes[1]);
  EXPECT_NE(ca.hashes[2], cb.hashes[2]);
  EXPECT_NE(ca.hashes[3], cb.hashes[3]);  // everything after a difference differs
}

TEST(BlockChain, NamespaceIsolation) {
  // The same prompt under two cache_salt values shares no block.
  const std::string prompt(64 * 20, 'x');
  const BlockChain a = hash_text(namespace_root("m", "salt-1"), prompt);
  const BlockChain b = hash_text(namespace_root("m", "salt-2"), prompt);
  ASSERT_EQ(a.hashes.size(), 20u);
  for (auto h : a.hashes) {
    for (auto g : b.hashes) EXPECT_NE(h, g);
  }
  // ... and neither do two models.
  const BlockChain c = hash_text(namespace_root("m2", "salt-1"), prompt);
  EXPECT_NE(a.hashes[0], c.hashes[0]);
  // The separator keeps ("ab", "") and ("a", "b") apart.
  EXPECT_NE(namespace_root("ab", ""), namespace_root("a", "b"));
}

TEST(BlockChain, ShortPromptHasNoBlocks) {
  EXPECT_TRUE(hash_text(1, "short").hashes.empty());
  EXPECT_TRUE(hash_tokens(1, iota_tokens(15)).hashes.empty());
}

}  // namespace
}  // namespace kvroute::hashing
