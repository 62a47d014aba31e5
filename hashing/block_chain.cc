#include "hashing/block_chain.h"
#include "hashing/length_prefixed.h"

#include <bit>
#include <cmath>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace kvroute::hashing {

double BlockChain::tokens_per_block() const {
  return unit == Unit::kToken ? static_cast<double>(block_units) : block_units / kBytesPerToken;
}

std::uint64_t BlockChain::estimated_tokens() const {
  if (unit == Unit::kToken) return total_units;
  return static_cast<std::uint64_t>(std::ceil(static_cast<double>(total_units) / kBytesPerToken));
}

void append_length_prefixed(std::string& out, std::string_view field) {
  const auto n = static_cast<std::uint32_t>(field.size());
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out.append(field);
}

std::uint64_t namespace_root(std::string_view model, std::string_view salt) {
  // Length-prefixed fields: no (model, salt) pair can be spelled as another (docs/hashing.md).
  static constexpr std::string_view kTag = "kvroute/v2";
  std::string key;
  key.reserve(kTag.size() + 8 + model.size() + salt.size());
  key.append(kTag);
  append_length_prefixed(key, model);
  append_length_prefixed(key, salt);
  return XXH3_64bits_withSeed(key.data(), key.size(), 0);
}

BlockHash hash_block(BlockHash parent, const void* data, std::size_t size) {
  return XXH3_64bits_withSeed(data, size, parent);
}

BlockChain hash_tokens(std::uint64_t root, std::span<const std::uint32_t> tokens, std::uint32_t block_tokens) {
  BlockChain chain;
  chain.root = root;
  chain.unit = Unit::kToken;
  chain.block_units = block_tokens == 0 ? kDefaultBlockTokens : block_tokens;
  chain.total_units = tokens.size();
  const std::size_t blocks = tokens.size() / chain.block_units;
  chain.hashes.reserve(blocks);
  BlockHash parent = root;
  if constexpr (std::endian::native == std::endian::little) {
    for (std::size_t b = 0; b < blocks; ++b) {
      parent = hash_block(parent, tokens.data() + b * chain.block_units, chain.block_units * 4);
      chain.hashes.push_back(parent);
    }
  } else {
    std::vector<unsigned char> buf(chain.block_units * 4);
    for (std::size_t b = 0; b < blocks; ++b) {
      for (std::uint32_t i = 0; i < chain.block_units; ++i) {
        std::uint32_t t = tokens[b * chain.block_units + i];
        for (int k = 0; k < 4; ++k) buf[i * 4 + k] = static_cast<unsigned char>(t >> (8 * k));
      }
      parent = hash_block(parent, buf.data(), buf.size());
      chain.hashes.push_back(parent);
    }
  }
  return chain;
}

BlockChain hash_text(std::uint64_t root, std::string_view text, std::uint32_t block_bytes) {
  BlockChain chain;
  chain.root = root;
  chain.unit = Unit::kByte;
  chain.block_units = block_bytes == 0 ? kDefaultBlockBytes : block_bytes;
  chain.total_units = text.size();
  const std::size_t blocks = text.size() / chain.block_units;
  chain.hashes.reserve(blocks);
  BlockHash parent = root;
  for (std::size_t b = 0; b < blocks; ++b) {
    parent = hash_block(parent, text.data() + b * chain.block_units, chain.block_units);
    chain.hashes.push_back(parent);
  }
  return chain;
}

}  // namespace kvroute::hashing
