// RateLearner: per-worker performance rates learned online from completed requests (architecture section 7:
// "P_w, X_w and the per-token decode cost are learned online per worker from observed TTFT against uncached
// tokens, starting from the worker profile"). The daemon's RouteObserver and the fleet simulator both feed
// it and copy its rates into the WorkerViews that kv_cost (and e2) read.
//
// Model of one request's TTFT on worker w, the request having been sent while the router believed
// `queue_s` seconds of prefill work were ahead of it:
//     ttft = base_w + queue_s + uncached / P_w + cpu_tokens / X_w
// base_w (front end, scheduling, the first step's overhead) is an exponential moving average of
// ttft - queue_s over requests with little to compute; P_w is an EMA of the rate that makes
// prefill_seconds(uncached, cached, P_w) = ttft - queue_s - base_w, over requests with at least
// min_uncached_tokens to compute and at most max_queue_for_prefill_s queued ahead (the queue estimate counts
// the request at its head in full although it is partly done, which made P look ~30 % too fast at load) (so P_w stays quoted at the reference context whatever the prompt sizes). Samples are clamped to [1/4, 4] x the prior,
// so one request stuck behind an unmodelled burst cannot swing the rate. The decode step is modelled as
// step(batch) = decode_step_s + decode_step_per_token_s x batch context tokens (memory-bound decode reads the
// weights and every running sequence's KV), and an EMA of observed ITL / step(batch) corrects it. The error of
// the TTFT the router reports is learned too (WorkerRates::ttft_log_error, policy::corrected_ttft_estimate). X_w keeps its prior unless requests that were mostly loaded from the CPU
// tier show otherwise (same EMA, on the CPU-tier part of the TTFT).
//
//   RateLearner learner;
//   learner.set_prior(w, {.prefill_tokens_per_s = 18000, .transfer_tokens_per_s = 2e5, .decode_step_s = 0.02});
//   learner.observe(w, {.ttft_s = 0.4, .queue_s = 0.1, .uncached_tokens = 5000, .itl_s = 0.021, .output_tokens = 200});
//   learner.apply(view);   // view.prefill_tokens_per_s, transfer_tokens_per_s, decode_step_s
//
// Thread safety: all methods may be called concurrently (one mutex; calls are short).
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

#include "policy/routing_policy.h"

namespace kvroute::policy {

// Prefill cost grows with the context a token attends to: per token, a fixed part (the weight matmuls) plus a
// part proportional to the tokens before it (attention). With linear cost a and attention cost b per context
// token, a chunk of m new tokens after g cached ones costs m x (a + b x (g + m / 2)). For 8B-class dense models
// at the usual utilisations the two parts are equal at about 23K tokens of context (Qwen3-8B on H100: a =
// 2 x 8.2e9 FLOP / (989 TFLOP/s x 0.675), b = 4 x 32 heads x 128 x 36 layers FLOP / (989 TFLOP/s x 0.56);
// b / a = 1 / 23,000), which is what makes a cold 100K prompt take 7.5 s rather than 2.5 s.
// P (prefill_tokens_per_s) is quoted at kReferenceContextTokens of average context: an 8K chunk after 8K.
inline constexpr double kAttentionContextTokens = 23000.0;
inline constexpr double kReferenceContextTokens = 8192.0 + 4096.0;

// Seconds to prefill `tokens` new tokens after `cached` tokens already in the KV cache, at rate P quoted at
// the reference context.
inline double prefill_seconds(double tokens, double cached, double prefill_tokens_per_s) {
  // The constant divisions as products (kv_cost prices a few prefills per worker and request).
  constexpr double kPerContextToken = 1.0 / kAttentionContextTokens;
  constexpr double kPerReference = 1.0 / (1.0 + kReferenceContextTokens / kAttentionContextTokens);
  const double scale = (1.0 + (cached + tokens * 0.5) * kPerContextToken) * kPerReference;
  return tokens * scale / (prefill_tokens_per_s > 1.0 ? prefill_tokens_per_s : 1.0);
}

// Seconds of prefill queued on worker w, its pending tokens at its rate: when a request sent there now starts its
// own prefill (the prefix hold's question, below), the queue_s a completed request's TTFT is learned against
// (RateLearner::observe), and the fleet's spare prefill (kv_cost's fleet-busy price).
inline double queued_prefill_seconds(const WorkerView& w) {
  return static_cast<double>(w.pending_prefill_tokens) / (w.prefill_tokens_per_s > 1.0 ? w.prefill_tokens_per_s : 1.0);
}

// Chunked-prefill token budget per engine step (vLLM's default max_num_batched_tokens for chunked prefill on large
// GPUs is 8192 in V1). A longer prefill runs over several steps, one chunk each, and each step also runs the decode
// batch (architecture section 8).
inline constexpr double kChunkTokens = 8192.0;

// Whether kv_cost's prefix hold pays on worker w for a request whose matched prefix there, `prefix_tokens` long, an
// earlier request (the leader) is still computing (Router::prefix_held; the simulator holds alike). `leader_tokens`:
// the part of that prefix the leader computes (the rest it found cached); `leader_started`: whether its prefill has
// started, the prefill queued ahead of it when it was sent being done by now.
//
// Sent at once, the request waits in the engine's queue and is admitted in a step after the leader's, reading what
// the leader's earlier steps stored. It computes again only what the leader computes in the step it is admitted
// with: the whole prefix when both wait to start together, at most the leader's last chunk once the leader's prefill
// has started. So once the leader has started on a part of the prefix that fits in one chunk, the step computing it
// is under way and ends before the request can be admitted: the request reads the whole prefix without a hold, and
// a hold would only delay it, to the leader's first token, behind whatever was sent there meanwhile. Family seeds 506
// and 534 (a 3.6K / 3.9K-token prefix every request shares): requests held behind the first ones had TTFTs of
// 0.21-0.23 s where round robin, sending at once on the same workers, had 0.13-0.15 s, p99 TTFT 1.25x and 1.27x
// round robin's; 0.96x and 1.01x the best other policy's since (docs/benchmarks.md, "A prefix hold only while its
// leader waits").
//
// Held, the request reads that prefix from cache, but its own fixed part of TTFT (front end, scheduling:
// WorkerView::base_ttft_s) starts only once the prefix lands instead of while it is computed; sent at once, it
// computes again at most the prefix. So the hold pays while the prefix's prefill outlasts that fixed part. Family
// seed 43 (a 1,120-token prefix every request shares, its 1,000 requests within 2.5 s): the first ones, held until
// the prefix landed, had TTFTs of 0.15-0.21 s against round robin's 0.11-0.14 s, p99 TTFT 1.52x round robin's; 0.89x
// since (docs/benchmarks.md, "A prefix hold only where it pays").
inline bool prefix_hold_pays(const WorkerView& w, double prefix_tokens, double leader_tokens, bool leader_started) {
  if (leader_started && leader_tokens <= kChunkTokens) return false;
  return prefill_seconds(prefix_tokens, 0.0, w.prefill_tokens_per_s) > w.base_ttft_s;
}

struct WorkerRates {
  double prefill_tokens_per_s = 10000.0;
  double transfer_tokens_per_s = 100000.0;
  double decode_step_s = 0.02;     // one decode step of an empty batch (weights + step overhead)
  // Extra decode-step time per context token of the running batch (attention reads every running sequence's
  // KV: bytes per token / HBM bandwidth). apply() reports decode_step_s + this x the view's
  // active_decode_tokens, so the policy sees the step time of the batch the worker runs now.
  double decode_step_per_token_s = 0.0;
  double decode_correction = 1.0;  // learned: observed ITL / modelled step time
  double base_ttft_s = 0.0;        // fixed part of TTFT (learned)
  std::uint64_t prefill_samples = 0;
  std::uint64_t decode_samples = 0;
  // Self-correction (architecture section 7, "estimates are checked"): for every completed request whose pick
  // carried estimates, EMAs of ln(observed / estimated) (exp(ttft_log_error) is the correction applied to the
  // TTFT the router reports, policy::corrected_ttft_estimate) and of |observed / estimated - 1|, for TTFT and ITL.
  // The TTFT estimate checked is the uncorrected reported one (policy::uncorrected_ttft_estimate: the pick's
  // expected TTFT, fixed part included), not the routing estimate: a ratio corrects a bias, and the routing
  // estimate's error is no single ratio (it leaves out the fixed part, which dominates short requests).
  double ttft_log_error = 0.0;
  double ttft_abs_error = 0.0;
  double itl_abs_error = 0.0;
  std::uint64_t error_samples = 0;
};

struct RateObservation {
  double ttft_s = 0;               // observed time to first token
  double queue_s = 0;              // router's estimate, at dispatch, of prefill work queued ahead (seconds)
  std::uint64_t uncached_tokens = 0;  // prompt tokens the worker computed (prompt - reported cached)
  std::uint64_t cached_tokens = 0;    // reported cached tokens (the context the computed tokens attend to)
  std::uint64_t cpu_tokens = 0;    // cached tokens that came from the CPU tier, when known
  double itl_s = 0;                // mean inter-token latency of the request (0 when < 2 output tokens)
  std::uint64_t decode_context_tokens = 0;  // router-tracked active decode tokens of the worker while it decoded
  std::uint32_t output_tokens = 0;
  // The TTFT reported for this request before the learned correction (policy::uncorrected_ttft_estimate) and
  // the pick's ITL estimate (Pick::itl_estimate_s); 0 when there was none.
  double estimated_ttft_s = 0;
  double estimated_itl_s = 0;
};

struct RateLearnerOptions {
  double alpha = 0.05;                    // EMA weight of a new sample
  std::uint64_t min_uncached_tokens = 1024;  // below this a TTFT says more about overheads than about P
  double clamp = 4.0;                     // samples are kept within [prior / clamp, prior x clamp]
  // P is learned only from requests the router believed had at most this much prefill queued ahead (see
  // observe()); longer queues are overestimated (the request at their head is partly done).
  double max_queue_for_prefill_s = 0.05;
};

class RateLearner {
 public:
  explicit RateLearner(RateLearnerOptions options = {}) : o_(options) {}

  // Starting point (the worker's profile); resets what was learned for that worker.
  void set_prior(WorkerId worker, const WorkerRates& prior);
  void observe(WorkerId worker, const RateObservation& obs);
  WorkerRates rates(WorkerId worker) const;
  // What prefilling `tokens` uncached tokens takes on a typical worker: prefill_seconds() at the mean current
  // prefill rate over the workers known here (the default rate when none is). BurstStagger's prefill estimate.
  double typical_prefill_s(double tokens) const;
  // Copies the learned rates into a WorkerView (view.id selects the worker). A worker that has not completed
  // a request of a kind yet (no prefill, decode or estimate sample) is given the fleet's learned ratio to the
  // prior for it: an unvisited worker looks like the workers that were measured, not like an uncorrected
  // prior, so it gets traffic and is measured in turn (a prior never corrected is how a worker starves).
  void apply(WorkerView& view) const;
  // Rates learned elsewhere (another router replica): taken as this worker's current rates while nothing was
  // learned here yet; false when samples of its own were already taken (they win). Of them, apply() uses the
  // fixed TTFT, the transfer rate and the decode step; the prefill rate and the decode and TTFT corrections of a
  // worker without samples of its own stay the fleet's learned ratio, as for any unmeasured worker. Taking the
  // other replica's per-worker values for those too made 8 simulated replicas disagree on which worker is
  // fastest: hit rate 0.932x one router's instead of 1.012x on the synthetic trace's first 3,000 requests
  // (docs/benchmarks.md, "A new replica's index and rates").
  bool seed(WorkerId worker, const WorkerRates& learned);
  // Forget a removed worker (its next prior starts fresh).
  void forget(WorkerId worker);

 private:
  struct State {
    WorkerRates prior, now;
    bool known = false;
  };
  State& state(WorkerId w);
  void learn_errors(State& s, const RateObservation& obs);  // with mu_ held

  RateLearnerOptions o_;
  mutable std::mutex mu_;
  std::vector<State> workers_;  // guarded by mu_
  // Fleet-wide EMAs over every worker's samples (guarded by mu_): learned P / prior P, the decode correction,
  // and ln(observed / estimated TTFT); what apply() gives a worker without samples of its own.
  double fleet_prefill_ratio_ = 1.0, fleet_decode_correction_ = 1.0, fleet_ttft_log_error_ = 0.0;
};

}  // namespace kvroute::policy
