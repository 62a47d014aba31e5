// Reference hit rates a routing policy is measured against (architecture section 10).
//
//  * upper bound: one infinite cache shared by the whole fleet; a request hits every leading block that any
//    earlier request (prompt or decoded output) produced.
//  * capacity bound: one LRU cache holding the whole fleet's KV capacity (GPU + CPU tiers of every worker,
//    in 16-token blocks), filled in vLLM's order: a request's blocks are touched tail first so its first
//    block ends most recently used and a finished request's tail is evicted first. No router can beat it by
//    more than the luck of LRU, since splitting the same capacity over workers only duplicates blocks.
//
// Both count hits like an engine: whole leading blocks, and never the prompt's last token (an engine
// always computes at least one token to produce logits), token-weighted over all requests.
//
//   double ub = upper_bound_hit_rate(workload);
//   double cb = capacity_bound_hit_rate(workload, 8 * (gpu_blocks + cpu_blocks));
#pragma once

#include <cstdint>

#include "bench/workload.h"

namespace kvroute::bench {

// Tokens of a `prompt_tokens` prompt an engine can serve from `matched_blocks` leading cached blocks.
std::uint64_t servable_cached_tokens(std::uint64_t matched_blocks, std::uint64_t prompt_tokens);

double upper_bound_hit_rate(const Workload& w);
double capacity_bound_hit_rate(const Workload& w, std::uint64_t capacity_blocks);

}  // namespace kvroute::bench
