// `kvroute-sim plan`: the capacity planner's command line (backends/sim/plan.h does the arithmetic).
//
// Reads a model (a config.json path or a built-in profile name), a GPU, the p95 context length, the peak
// concurrency, the KV and weight dtypes, an optional shared prefix and CPU tier, prints the plan and returns
// the exit status (0, or 2 with a message on stderr for bad input).
//
//   kvroute-sim plan llama-3.1-70b --gpu h200-141gb --context 8K --concurrency 64 --kv-dtype fp8
//     --weights-dtype fp8   (one command line)
#pragma once

#include <string_view>
#include <vector>

namespace kvroute::sim {

extern const char* const kPlanUsage;

int run_plan(const std::vector<std::string_view>& args);

}  // namespace kvroute::sim
