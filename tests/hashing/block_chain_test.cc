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

// Golden vectors of docs/hashing.md (spec version 2). A change here is a change of the wire spec.
TEST(BlockChainGolden, NamespaceRoots) {
  EXPECT_EQ(namespace_root("", ""), 0xc226ca54297d5498ull);
  EXPECT_EQ(namespace_root("qwen3-8b", ""), 0x6356a285bb8441c7ull);
  EXPECT_EQ(namespace_root("qwen3-8b", "tenant-a"), 0xc1072f1d2437a49full);
}

TEST(BlockChainGolden, TokenChain) {
  const auto tokens = iota_tokens(40);  // 2 full blocks of 16, 8-token tail ignored
  const BlockChain c = hash_tokens(namespace_root("qwen3-8b", ""), tokens);
  ASSERT_EQ(c.hashes.size(), 2u);
  EXPECT_EQ(c.hashes[0], 0x01cd618971619346ull);
  EXPECT_EQ(c.hashes[1], 0xab017542b923e683ull);
  EXPECT_EQ(c.total_units, 40u);
  EXPECT_EQ(c.estimated_tokens(), 40u);
}

TEST(BlockChainGolden, TextChain) {
  const std::string text(130, 'a');  // 2 full blocks of 64 bytes, 2-byte tail ignored
  const BlockChain c = hash_text(namespace_root("qwen3-8b", ""), text);
  ASSERT_EQ(c.hashes.size(), 2u);
  EXPECT_EQ(c.hashes[0], 0xb1d48be1e2678464ull);
  EXPECT_EQ(c.hashes[1], 0xef808941df9c38eaull);
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
  // Length-prefixed fields keep ("ab", "") and ("a", "b") apart, and a NUL byte inside a field cannot
  // stand in for a field boundary (spec version 1 joined the fields with NUL separators).
  EXPECT_NE(namespace_root("ab", ""), namespace_root("a", "b"));
  EXPECT_NE(namespace_root(std::string_view("a\0b", 3), ""), namespace_root("a", std::string_view("b\0", 2)));
  EXPECT_NE(namespace_root("a/s", ""), namespace_root("a", "s"));
  EXPECT_EQ(kSpecVersion, 2);
}

TEST(BlockChain, ShortPromptHasNoBlocks) {
  EXPECT_TRUE(hash_text(1, "short").hashes.empty());
  EXPECT_TRUE(hash_tokens(1, iota_tokens(15)).hashes.empty());
}

}  // namespace
}  // namespace kvroute::hashing
