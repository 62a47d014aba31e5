// Discrete-event fleet simulation in virtual time (architecture sections 2, 5, 7, 10).
//
// One run drives N simulated engines (backends/sim/engine.h) through the router's real code: for every
// arrival it builds the RoutingContext exactly as the daemon does (the request's block chain ->
// PrefixIndex::match -> WorkerViews from router-tracked load plus worker metrics as last polled plus rates
// learned by policy::RateLearner -> session binding -> RoutingPolicy::pick) and then feeds the index:
//   approximate mode  PrefixIndex::record(worker, chain) with the worker's num_gpu_blocks as capacity;
//   precise mode      the engines' own KV events (stored / removed / cleared), applied event_delay_s late,
//                     plus the chain the router just routed (until events confirm or remove it), since the
//                     events of a prefill arrive only after it ran: Dynamo's KV router does the same.
// Staleness is configurable: metrics (running, waiting, KV usage) are polled every metrics_interval_s.
//
// Event order at equal virtual times is fixed (engines, then KV-event deliveries, then metric polls, then
// the arrival), every random draw comes from the seed, and so the same inputs give bit-identical results.
// Only decision_us (the router's own wall-clock decision time) varies between runs.
//
//   SimOptions o;  o.workers = 8;  o.rate_scale = 2;
//   auto runs = plan_runs({"round_robin", "kv_cost"}, ModeChoice::kNative);
//   Result<PolicyResult> r = simulate(workload, (*runs)[1], o);
#pragma once

#include <atomic>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "backends/sim/engine.h"
#include "bench/workload.h"
#include "policy/routing_policy.h"
#include "util/result.h"

namespace kvroute::bench {

enum class IndexMode : std::uint8_t { kNone, kApproximate, kPrecise };
// What router replicas share (--sharing): nothing, or what the daemon's --shared-state shares through Redis.
enum class Sharing : std::uint8_t { kNone, kRedis };
Result<Sharing> parse_sharing(std::string_view s);
enum class ModeChoice : std::uint8_t { kNative, kApproximate, kPrecise, kBoth };
Result<ModeChoice> parse_mode(std::string_view s);

struct PolicyRun {
  std::string policy;  // a name from policy::policy_names()
  IndexMode mode = IndexMode::kNone;
  std::string label;   // policy name, with "(approx)" / "(precise)" when not the policy's native mode
};

// The index mode a policy's original system uses: SGLang's cache_aware and Preble's e2 keep a tree of what
// they routed (approximate); Dynamo's block_cost and llm-d's weighted_scorers consume KV events (precise);
// kv_cost is ours and reported precise; prefix-blind policies need no index.
IndexMode native_mode(std::string_view policy);
Result<std::vector<PolicyRun>> plan_runs(const std::vector<std::string>& policies, ModeChoice mode);

struct SimOptions {
  std::size_t workers = 8;
  std::string model = "qwen3-8b";
  std::string gpu = "h100-80gb";
  double cpu_tier_gb = 0;           // per worker; 0 = no CPU tier (vLLM's default)
  sim::PrefixCommit prefix_commit = sim::PrefixCommit::kStepEnd;  // when computed blocks become hits
  double rate_scale = 1.0;          // arrival times are divided by it (2 = twice the request rate)
  std::uint64_t seed = 1;
  double metrics_interval_s = 0.5;  // how often worker metrics are polled (0 = always fresh)
  double event_delay_s = 0.05;      // how late KV events reach the index (precise mode)
  double session_ttl_s = 600;       // idle time after which a session binding is dropped
  double prefix_hold_s = 0.4;       // kv_cost's prefix hold at most (the daemon's --prefix-hold); 0: none
  // Router replicas (architecture section 11). Arrivals go round-robin to `replicas` router states, each with
  // its own index, session bindings, in-flight view, learned rates and TTFT tail; in precise mode every one
  // reads the workers' KV events. With Sharing::kRedis they share what the daemon's --shared-state shares:
  //   routed records (approximate mode: worker + chain; both modes: the session bound), readable by the others
  //     sync_delay_s after the routing (the stream's XADD, then the others' outstanding XREAD BLOCK);
  //   load, which each replica publishes and reads every load_interval_s on its own clock (phases spread over
  //     the interval), so what it prices is the others' load as it was sync_delay_s + 0..2 intervals ago;
  //   learned rates every rates_interval_s, seeding the workers a replica has not measured yet.
  std::size_t replicas = 1;
  Sharing sharing = Sharing::kNone;
  double sync_delay_s = 0.002;       // a record's way from one replica through Redis to another
  double load_interval_s = 0.025;    // the daemon's --shared-state-interval
  double rates_interval_s = 2.0;     // SharedState::Options::rates_interval
  // Sharing replicas take turns in bursts (policy::BurstStagger, the daemon's --shared-state-stagger): replica
  // r routes a request that came in a burst r x sync_delay_s late, when that pays.
  bool stagger = true;
  policy::PolicyOptions policy;
  // Debug: when set, every run writes DIR/<label>@<rate_scale>.csv, one line per request (arrival, prompt and
  // output tokens, worker, predicted and reported cached tokens, the pick's TTFT estimate, the worker's
  // router-tracked pending prefill and in-flight count at dispatch, TTFT, end-to-end latency, the longest
  // match any worker had, the worker the request's session was bound to or -1).
  std::string dump_dir;
};

struct LatencyStats {
  double mean = 0, p50 = 0, p90 = 0, p99 = 0;
  std::size_t count = 0;
};

// Statistics shared by the simulator and the replayer, so their columns compare: percentiles interpolate
// linearly between the nearest ranks of the sorted samples.
double percentile(const std::vector<double>& sorted, double q);
LatencyStats stats_of(std::vector<double> samples);
double coefficient_of_variation(const std::vector<double>& v);  // 0 for an empty or all-zero sample

struct PolicyResult {
  std::string name;  // label
  IndexMode mode = IndexMode::kNone;
  double hit_rate = 0;              // sum(cached tokens as engines report them) / sum(prompt tokens)
  LatencyStats ttft, ttft_cold, ttft_warm;  // warm: the engine reported >= 50 % of the prompt cached
  double itl_mean_s = 0;             // token-weighted mean inter-token latency
  double itl_p99_s = 0;              // p99 over requests of each request's mean inter-token latency
  double e2e_mean_s = 0, e2e_p99_s = 0;
  // Calibration of the policy's own estimates (kv_cost): |observed / estimated - 1| over completed requests
  // whose pick carried an estimate, median and p90, for TTFT and ITL; count 0 when the policy estimates nothing.
  struct Calibration {
    double ttft_median = 0, ttft_p90 = 0, itl_median = 0, itl_p90 = 0;
    std::size_t ttft_count = 0, itl_count = 0;
  } calibration;
  // Sustained output throughput: output tokens generated while requests were arriving (first to last
  // arrival) / that time. The tail after the last arrival (draining) is left out: it measures one request's
  // luck more than the policy. output_tok_s_total includes it: all output tokens / (last finish - first arrival).
  double output_tok_s = 0;
  double output_tok_s_total = 0;
  std::size_t completed = 0;
  double load_cov = 0;              // coefficient of variation of engine busy time over workers
  double requests_cov = 0;          // same, of requests per worker
  std::uint64_t evicted_blocks = 0; // GPU (+ CPU tier) blocks whose cached content was dropped
  std::uint64_t preemptions = 0;
  double decision_us_p50 = 0, decision_us_p99 = 0;
  std::uint64_t staggered = 0;      // requests a replica routed later, in turn (SimOptions::stagger)
  std::uint64_t warm_ups = 0;       // prompts sent to a second worker to copy a prefix there (policy::Pick::warm)
  double wall_s = 0;                // wall-clock time of this run
  std::vector<double> ttfts;        // sorted, for CDF plots
};

// The per-request columns of a PolicyResult, accumulated the same way by the simulator and the replayer so
// that their tables compare.
class RequestTally {
 public:
  // One completed request: its TTFT and end-to-end latency, decode_s seconds after the first token over
  // itl_tokens output tokens (ITL is token-weighted), cached / prompt / output token counts, and the times it
  // started and ended.
  void add(double ttft_s, double e2e_s, double decode_s, std::uint32_t itl_tokens, std::uint64_t cached,
           std::uint64_t prompt, std::uint64_t output, double start_s, double end_s);
  // Fills completed, hit_rate, the TTFT statistics (and the sorted ttfts), e2e_mean_s and itl_mean_s; returns
  // output tokens over the time from the first start to the last end (0 when that is empty).
  double fill(PolicyResult& res);
  // The estimates the pick made for a completed request (0: none) against what was observed; fill() reports
  // the spread of observed / estimated in PolicyResult::calibration.
  void add_estimate(double ttft_s, double ttft_est_s, double itl_s, double itl_est_s);

 private:
  std::vector<double> ttft_, cold_, warm_, itl_, e2e_, ttft_err_, itl_err_;
  double e2e_sum_ = 0, itl_num_ = 0, itl_den_ = 0, first_ = std::numeric_limits<double>::infinity(), last_ = 0;
  std::uint64_t cached_ = 0, prompt_ = 0, output_ = 0;
};

// Capacity of one worker as the engine sizes it (GPU and CPU blocks), for the capacity bound.
struct FleetCapacity {
  std::uint64_t gpu_blocks_per_worker = 0;
  std::uint64_t cpu_blocks_per_worker = 0;
  double unloaded_prefill_tokens_per_s = 0;
};
Result<FleetCapacity> fleet_capacity(const SimOptions& options);

// Runs one policy over the workload. `progress` (optional) counts arrivals routed so far.
Result<PolicyResult> simulate(const Workload& workload, const PolicyRun& run, const SimOptions& options,
                              std::atomic<std::size_t>* progress = nullptr);

}  // namespace kvroute::bench
