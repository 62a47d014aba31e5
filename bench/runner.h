// `kvroute-bench simulate`: command-line options, workload loading and the side-by-side run of every policy on
// identical arrivals (on a small pool of threads; each run is independent and deterministic, so the thread
// count never changes a result).
//
//   Result<BenchConfig> c = parse_simulate_args({"--workload", "multi_turn", "--workers", "4"});
//   Result<Workload> w = load_workload(*c);
//   Result<RunReport> r = run_policies(*w, *c, c->sim.rate_scale);
//   std::cout << format_table(*r);
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "bench/report.h"
#include "bench/simulate.h"
#include "bench/workload.h"
#include "util/result.h"

namespace kvroute::bench {

struct BenchConfig {
  std::string trace;                 // --trace FILE (Mooncake format)
  std::string workload;              // --workload NAME (built-in generator)
  SimOptions sim;
  std::vector<std::string> policies; // default: all ten
  ModeChoice mode = ModeChoice::kNative;
  std::size_t max_requests = 0;
  std::string json_path;
  std::string plots_dir;
  std::vector<double> sweep;         // rate scales; empty = just sim.rate_scale
  // --knee F: find the rate scale where round_robin's mean TTFT reaches F x its unloaded TTFT (measured at
  // knee_unloaded_scale) and sweep {0.75, 1, 1.25} x that scale.
  double knee_factor = 0;
  double knee_unloaded_scale = 0.01;
  unsigned threads = 2;
  bool progress = true;
};

// Usage text of the simulate subcommand.
std::string simulate_usage();
// Parses the arguments after "simulate". "--help" yields an Error whose message is the usage text.
Result<BenchConfig> parse_simulate_args(const std::vector<std::string>& args);

Result<Workload> load_workload(const BenchConfig& config);

// Runs every configured policy at one rate scale. `progress_line`, when set, receives a one-line status
// about twice a second (the CLI prints it on stderr).
Result<RunReport> run_policies(const Workload& workload, const BenchConfig& config, double rate_scale,
                               const std::function<void(const std::string&)>& progress_line = {});

// The knee search behind --knee (exposed for tests): round_robin's unloaded mean TTFT and the smallest rate
// scale (within ~2 %) at which its mean TTFT is at least factor x that.
struct Knee {
  double unloaded_ttft_s = 0;
  double scale = 0;
};
Result<Knee> find_knee(const Workload& workload, const BenchConfig& config, double factor);

// Hit-rate bounds of the workload on this fleet (independent of the rate scale and of the policies).
struct Bounds {
  double upper = 0, capacity = 0;
};
Result<Bounds> compute_bounds(const Workload& workload, const SimOptions& options);

// The whole subcommand: returns the process exit code; writes the table to stdout, errors and progress to
// stderr.
int run_simulate_command(const std::vector<std::string>& args);

// Command-line values of both subcommands: a finite number >= min, and a non-negative integer (digits only);
// the error names the flag and the value.
Result<double> parse_double(const std::string& flag, const std::string& v, double min);
Result<std::uint64_t> parse_count(const std::string& flag, const std::string& v);

// What a subcommand does with its argument parser's error: a "usage: ..." text (from --help) goes to stdout
// with exit code 0, anything else to stderr, prefixed with the command, with exit code 2.
int report_args_error(std::string_view command, const Error& error);
// What a subcommand does with the workload it loaded: when it failed to load or has no requests, says so on
// stderr, prefixed with the command, and returns 1; returns 0 when it can be run.
int report_workload_error(std::string_view command, const Result<Workload>& workload);

}  // namespace kvroute::bench
