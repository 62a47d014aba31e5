// `kvroute-bench family-summary`: judges kv_cost over the seeds of the workload family (bench/family.h) from
// the JSON documents `kvroute-bench simulate --workload family --seed N --json FILE` wrote, one or more per
// seed (documents of the same workload merge, so kv_cost and the other policies may come from separate runs).
//
// Per seed and figure it reports kv_cost's ratio to the best of all other policies, oriented so that above 1
// is worse: mean TTFT, p99 TTFT, mean ITL, mean end-to-end latency (kv_cost / best), and output throughput
// (best / kv_cost); a seed passes when every ratio is within its margin (issue acceptance: 2 %, 5 %, 5 %, 5 %,
// 2 %). It writes DIR/family.md (every seed, then the totals) and DIR/family_ratios.svg (each figure's ratios,
// seeds sorted by it).
//
//   kvroute-bench family-summary --out results/family results/family/seed_*.json
#pragma once

#include <string>
#include <vector>

#include "util/result.h"

namespace kvroute::bench {

struct FamilyMargins {
  double ttft_mean = 0.02, ttft_p99 = 0.05, itl_mean = 0.05, e2e_mean = 0.05, throughput = 0.02;
};

struct FamilySeedResult {
  std::string workload, description;
  // kv_cost's ratio to the best other policy per figure (above 1: worse), and which policy was best.
  double ttft_mean = 0, ttft_p99 = 0, itl_mean = 0, e2e_mean = 0, throughput = 0;
  std::string best_ttft_mean, best_ttft_p99, best_itl_mean, best_e2e_mean, best_throughput;
  double hit_rate = 0, capacity_bound = 0;
  bool some_policy_unsaturated = false;  // some policy kept mean TTFT under 1 s (the hit-rate condition applies)
  double calib_ttft_median = 0, calib_ttft_p90 = 0, calib_itl_median = 0, calib_itl_p90 = 0;
  bool within(const FamilyMargins& m) const;
};

// Reads the documents and pairs kv_cost with the other policies of the same workload.
Result<std::vector<FamilySeedResult>> read_family_results(const std::vector<std::string>& json_files);
std::string family_markdown(const std::vector<FamilySeedResult>& seeds, const FamilyMargins& m);
std::string family_svg(const std::vector<FamilySeedResult>& seeds);

// The subcommand: returns the exit code.
int run_family_summary_command(const std::vector<std::string>& args);

}  // namespace kvroute::bench
