// Output of `kvroute-bench simulate`: the side-by-side table, the JSON document and SVG plots.
//
// JSON shape (one document per rate scale; a sweep writes {"sweep": [documents...]}):
//   {"workload": "conversation_trace", "workers": 8, "rate_scale": 1.0, "description" (family draws only),
//    "replicas" and "sharing" (with more than one router replica),
//    "upper_bound_hit_rate": 0.37, "capacity_bound_hit_rate": 0.14,
//    "policies": [{"name": "kv_cost", "hit_rate", "ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s",
//                  "itl_mean_s", "itl_p99_s", "e2e_mean_s", "e2e_p99_s", "output_tok_s", "completed", "load_cov",
//                  "evicted_blocks", "decision_us_p50", "calibration" (policies that estimate: |observed /
//                  estimated - 1| of TTFT and ITL, "ttft_median_abs_err", "ttft_p90_abs_err", "itl_median_abs_err",
//                  "itl_p90_abs_err", "ttft_count", "itl_count"), plus extras: "mode", "ttft_cold_mean_s", "ttft_warm_mean_s",
//                  "cold_requests", "warm_requests", "requests_cov", "preemptions", "decision_us_p99"}]}
// Everything but decision_us_* is a deterministic function of the inputs and the seed.
//
// Plots are plain SVG written here (no plotting dependency): a TTFT CDF per policy, and for a sweep the hit
// rate and p99 TTFT of each policy against the rate scale.
#pragma once

#include <string>
#include <vector>

#include "bench/simulate.h"
#include "util/result.h"

namespace kvroute::bench {

struct RunReport {
  std::string workload;
  std::string description;              // the draw of a family workload (printed above the table)
  std::size_t workers = 0;
  std::size_t replicas = 1;             // router replicas (--replicas) and what they share (--sharing)
  std::string sharing = "none";
  double rate_scale = 1.0;
  double upper_bound_hit_rate = 0;
  double capacity_bound_hit_rate = 0;
  double knee_rate_scale = 0;           // with --knee: the rate scale found, and round_robin's unloaded TTFT
  double round_robin_unloaded_ttft_s = 0;
  std::vector<PolicyResult> policies;
};

std::string format_table(const RunReport& r);
// One report -> the JSON object above; several (a sweep) -> {"sweep": [...]}.
std::string to_json(const std::vector<RunReport>& reports);

struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points;
};
// A line chart; log_x puts the x axis on a log10 scale (x must be > 0).
std::string svg_line_chart(const std::string& title, const std::string& x_label, const std::string& y_label,
                           const std::vector<Series>& series, bool log_x);

// Writes ttft_cdf[_<scale>].svg for each report and, with more than one report, hit_rate_vs_load.svg and
// ttft_p99_vs_load.svg into `dir` (created if missing).
Result<std::vector<std::string>> write_plots(const std::string& dir, const std::vector<RunReport>& reports);

}  // namespace kvroute::bench
