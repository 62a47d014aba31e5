// Built-in workload generators: seeded, deterministic (the same name, options and seed give the same
// requests, bit for bit, on every platform: only integer PRNG arithmetic, no <random> distributions).
//
// Each generator builds real token sequences from seeded segments and hashes them with
// hashing::hash_tokens, so shared text gives shared 16-token blocks exactly as in a tokenized deployment.
//
//   shared_prefix  groups of requests share a long document / few-shot prefix, each adds its own question
//   multi_turn     chat sessions: each turn's prompt is the previous prompt + the assistant's answer + a new
//                  user message (sessions carry a session key); one of a few system prompts opens each chat
//   tenants        many tenants, each with a long system prompt in its own cache namespace (cache_salt),
//                  several users per tenant with a personal context reused across their requests
//   zipf_tools     agent/tool prompts (long tool definitions) whose popularity follows a Zipf law
//
//   Result<Workload> w = generate_workload("multi_turn", GeneratorOptions{.seed = 7});
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "bench/workload.h"
#include "util/result.h"

namespace kvroute::bench {

struct GeneratorOptions {
  std::uint64_t seed = 1;
  std::size_t requests = 0;        // 0 = the generator's default size
  std::string model = "qwen3-8b";  // namespace of the chains
};

const std::vector<std::string>& generator_names();
// An error names the unknown generator and lists the valid ones.
Result<Workload> generate_workload(std::string_view name, const GeneratorOptions& options);

// Deterministic PRNG used by the generators (splitmix64; Steele, Lea, Flood, OOPSLA 2014), exposed for tests.
class SplitMix {
 public:
  explicit SplitMix(std::uint64_t seed) : s_(seed) {}
  std::uint64_t next();
  double uniform();                                      // [0, 1)
  std::uint64_t range(std::uint64_t lo, std::uint64_t hi);  // [lo, hi]
  double exponential(double mean);
 private:
  std::uint64_t s_;
};

namespace internal {
// Appends `length` tokens of the text identified by `segment` (same segment, same tokens).
void append_segment(std::vector<std::uint32_t>& tokens, std::uint64_t segment, std::uint32_t length);
// Segment ids of different roles never collide: (kind, a, b, c) packed into one seed.
std::uint64_t segment_id(std::uint64_t kind, std::uint64_t a, std::uint64_t b = 0, std::uint64_t c = 0);
}  // namespace internal

// Zipf(s) sampler over ranks 0..n-1 by inverse CDF on a precomputed table.
class Zipf {
 public:
  Zipf(std::size_t n, double s);
  std::size_t sample(SplitMix& rng) const;
 private:
  std::vector<double> cdf_;
};

}  // namespace kvroute::bench
