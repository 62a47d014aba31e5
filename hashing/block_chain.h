// Block-chain hashing: the stable, versioned spec of docs/hashing.md.
//
// A prompt is cut into fixed-size blocks of units (token ids, or bytes of the canonical routing text) and
// every full block is hashed with XXH3-64, seeded by the previous block's hash; the first block is seeded
// by a namespace root derived from (model or LoRA adapter, tenant / cache_salt). Two prompts therefore
// share a block hash exactly when they share the namespace and every unit up to the end of that block.
//
//   uint64_t root = kvroute::hashing::namespace_root("llama-3.1-8b", "tenant-a");
//   BlockChain chain = kvroute::hashing::hash_text(root, canonical_text);
//   // chain.hashes[i] identifies the prefix made of blocks 0..i.
//
// The hashes leave the process (KV events, logs, other replicas), so nothing here is seeded per process.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvroute::hashing {

using BlockHash = std::uint64_t;

// Version of the spec; bump it (and the golden vectors) on any change to the recipe.
inline constexpr int kSpecVersion = 2;
inline constexpr std::uint32_t kDefaultBlockTokens = 16;
inline constexpr std::uint32_t kDefaultBlockBytes = 64;
// Bytes of English-like text per token, used to express text blocks in tokens.
inline constexpr double kBytesPerToken = 4.0;

enum class Unit : std::uint8_t { kToken, kByte };

struct BlockChain {
  std::uint64_t root = 0;
  Unit unit = Unit::kByte;
  std::uint32_t block_units = kDefaultBlockBytes;  // units per block
  std::uint64_t total_units = 0;                   // units in the prompt, including the unhashed tail
  std::vector<BlockHash> hashes;                   // one per full block

  // Tokens that one block stands for (block_units for token chains, block_units / kBytesPerToken for text).
  double tokens_per_block() const;
  // Estimated prompt length in tokens.
  std::uint64_t estimated_tokens() const;
};

// Root of a namespace: XXH3-64 of "kvroute/v2" u32le(len model) model u32le(len salt) salt, seed 0.
// Different (model, salt) pairs never share a block. `salt` is the worker-side cache_salt
// (router/cache_salt.h), empty for the shared namespace.
std::uint64_t namespace_root(std::string_view model, std::string_view salt);

// Chain over token ids, each hashed as 4 little-endian bytes.
BlockChain hash_tokens(std::uint64_t root, std::span<const std::uint32_t> tokens,
                       std::uint32_t block_tokens = kDefaultBlockTokens);
// Chain over the bytes of a text.
BlockChain hash_text(std::uint64_t root, std::string_view text,
                     std::uint32_t block_bytes = kDefaultBlockBytes);

// One link of the chain: the hash of `block` (raw bytes) seeded by `parent`.
BlockHash hash_block(BlockHash parent, const void* data, std::size_t size);

}  // namespace kvroute::hashing
