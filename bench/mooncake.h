// Reader of the Mooncake trace format (kvcache-ai/Mooncake, FAST25-release/traces): one JSON object per line,
//   {"timestamp": ms, "input_length": tokens, "output_length": tokens, "hash_ids": [ids], "session_id": opt}
// where each hash id stands for 512 tokens AND every token before them: two requests share a prefix exactly
// as far as their hash_ids lists agree.
//
// Expansion to the router's 16-token block chain (deterministic, documented so results are reproducible):
//   parent = namespace_root(model, "")
//   for the i-th id h of hash_ids, for j = 0..31 while the prompt still has a full 16-token block:
//       parent = hash_block(parent, little-endian bytes of {u64 h, u64 j});  emit parent
//   blocks past 32 x len(hash_ids) (input_length longer than the ids cover) are unique to the request:
//       parent = hash_block(parent, {u64 kUniqueTag, u64 line number, u64 j})
// Because every block is chained from the previous one, equal id prefixes give equal chains and the chain
// diverges for good at the first differing id. A partial last 512-token block contributes only its full
// 16-token blocks (floor(input_length / 16) blocks in all), as an engine's prefix cache would.
//
//   Result<Workload> w = read_mooncake_trace(path, {.model = "qwen3-8b", .max_requests = 1000});
//   if (!w) die(w.error().message);   // "trace.jsonl line 17: 'hash_ids' must be an array of integers"
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "bench/workload.h"
#include "util/result.h"

namespace kvroute::bench {

inline constexpr std::uint32_t kMooncakeBlockTokens = 512;
inline constexpr std::uint64_t kUniqueTag = 0x756e69717565ull;  // "unique"

struct MooncakeOptions {
  std::string model = "qwen3-8b";  // namespace of the chains (affects hash values only)
  std::size_t max_requests = 0;    // 0 = all; the earliest requests are kept
};

// Parses trace text (the whole file). `source` names it in error messages.
Result<Workload> parse_mooncake_trace(std::string_view text, std::string_view source, const MooncakeOptions& options);
// Reads and parses a file; the workload is named after the file's base name without extension.
Result<Workload> read_mooncake_trace(const std::string& path, const MooncakeOptions& options);

// The 16-token chain of one request (exposed for tests): see the expansion recipe above.
hashing::BlockChain expand_hash_ids(std::uint64_t root, const std::vector<std::uint64_t>& hash_ids,
                                    std::uint32_t input_length, std::uint64_t line_number);

}  // namespace kvroute::bench
