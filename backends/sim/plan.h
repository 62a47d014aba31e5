// The capacity planner behind `kvroute-sim plan`: the steps an operator takes before buying GPUs.
//
// Given a model (config.json shapes), a GPU, the p95 context length and the peak number of concurrent
// sequences, it budgets the weights plus the KV cache of every sequence against the usable memory (92 % of
// the GPU's, vLLM's gpu_memory_utilization as in kv_sizing(), or the device memory less a fixed allowance),
// gives a verdict, and when it does not fit walks the ladder of remedies in the order that costs least:
//   1. a shared prefix (a system prompt cached once per worker instead of once per sequence),
//   2. an FP8 KV cache (half the bytes per token),
//   3. a model with fewer KV heads or with MLA (the bytes per token that would fit),
//   4. more GPUs (how many, for the configuration after steps 1 and 2).
// It ends with the GPUs needed and the --worker-kv-blocks / --worker-max-seqs values to give kvroute.
//
//   PlanInput in{.model = *builtin_model("llama-3.1-70b"), .gpu = *builtin_gpu("h200-141gb"),
//                .context_tokens = 8192, .concurrency = 64};
//   in.kv_bytes_per_value = 1;          // FP8 cache
//   in.weight_bytes_per_param = 1;      // FP8 weights
//   Result<Plan> p = make_plan(in);     // p->base.sequences_on_given == 44 at 8K
//   std::cout << plan_report(in, *p);   // what `kvroute-sim plan` prints
//
// Shared prefix arithmetic: `users` sequences that share a prefix of P tokens, each with C tokens of context
// in all, hold (C - P) tokens each plus one copy of P per group of users: 32 users sharing a 16K prefix with
// 4K each hold 32 x 4K + 16K = 147,456 tokens instead of 32 x 20K = 655,360 (4.4x less). A worker holds one
// copy per group it serves; sliding-window layers are averaged over the context.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backends/sim/profile.h"
#include "util/result.h"

namespace kvroute::sim {

struct PlanInput {
  ModelProfile model;
  GpuProfile gpu;
  std::uint64_t context_tokens = 8192;  // p95 context length of a sequence (prompt + output, prefix included)
  std::uint32_t concurrency = 16;       // peak sequences running at once, fleet-wide
  double kv_bytes_per_value = 0;        // 2: 16-bit, 1: FP8; 0 keeps the model's
  double weight_bytes_per_param = 0;    // 2: BF16, 1: FP8, 0.5: 4-bit; 0 keeps the model's
  std::uint64_t shared_prefix_tokens = 0;  // tokens of a prefix (system prompt) the users share; 0: none
  std::uint32_t sharing_users = 0;         // users sharing one copy of it; 0: every sequence
  double cpu_tier_bytes = 0;            // CPU memory per worker for evicted KV blocks (0: none)
  double gpu_memory_utilization = 0.92;
  double allowance_bytes = 0;           // > 0: budget = device memory - this (activations, CUDA graphs) instead
  std::uint32_t gpus_per_worker = 1;    // tensor parallel size of one worker
  std::uint32_t block_tokens = 16;
};

// One configuration of the fleet (as given, or after some remedies) and what it holds.
struct PlanStep {
  std::string name;                 // "as given", "shared prefix", "FP8 KV cache", ...
  double kv_bytes_per_token = 0;    // average over the context (sliding windows)
  double kv_bytes_per_sequence = 0;
  double kv_bytes_total = 0;        // every concurrent sequence, with the shared prefix counted per group
  double tokens_total = 0;          // cached tokens those sequences hold
  double weight_bytes = 0;          // one copy, split over gpus_per_worker
  double usable_bytes = 0;          // budget of one worker (all its GPUs)
  double kv_room_bytes = 0;         // usable - weights, at least 0
  bool fits = false;                // weights + every sequence's KV on one worker
  std::uint64_t sequences_on_given = 0;    // p95-length sequences (shared prefix counted) one worker as given holds
  std::uint64_t sequences_per_worker = 0;  // the same on a worker of gpus_per_worker GPUs
  std::uint64_t kv_blocks_per_worker = 0;  // the KV pool in blocks: --worker-kv-blocks
  std::uint32_t gpus_per_worker = 1;       // the worker size needing the fewest GPUs in all (tensor parallel)
  std::uint32_t workers = 0;               // workers to hold the peak concurrency (0: cannot)
  std::uint32_t gpus = 0;                  // workers x gpus_per_worker
};

struct Plan {
  PlanStep base;                  // as given
  std::vector<PlanStep> ladder;   // the remedies in order, each applied on top of the previous
  // Remedy 3 (fewer KV heads or MLA): KV bytes per token that would fit, the KV heads that gives (0 for MLA
  // models), and what an MLA latent of DeepSeek-V3's size (512 + 64 per layer) would take at this depth.
  double max_kv_bytes_per_token = 0;
  std::uint32_t max_kv_heads = 0;
  double mla_kv_bytes_per_token = 0;
  // What to deploy: the first of as given / shared prefix / FP8 cache whose weights and peak concurrency fit
  // one worker as given, else the one of them that needs the fewest GPUs (remedy 4: more or larger workers).
  PlanStep recommended;
  double cpu_tier_tokens = 0;             // tokens the CPU tier holds at the recommended KV dtype
};

// Checks the input (positive context and concurrency, prefix shorter than the context, dtypes 1/2/4 or 0.5
// bytes) and computes the plan.
Result<Plan> make_plan(const PlanInput& in);

// The report `kvroute-sim plan` prints: budget table, verdict, ladder, GPUs needed, kvroute flags.
std::string plan_report(const PlanInput& in, const Plan& plan);

}  // namespace kvroute::sim
