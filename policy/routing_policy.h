// RoutingPolicy: picks the worker for one request from a RoutingContext (architecture sections 2 and 6).
//
// Contract: pick() is a pure function of the context: it never mutates the policy, the index or the
// registry, so any number of threads may call it at once and the benchmark can replay it deterministically.
// Everything that changes with traffic (in-flight counts, matches, the request's sequence number and random
// draw) arrives in the context. A policy copes with missing context: a worker without reported metrics has
// zeros, and a policy that needs a prefix match sees all-zero matches when the index is empty.
//
//   auto policy = make_policy("kv_cost", PolicyOptions{});
//   std::optional<Pick> p = (*policy)->pick(ctx);   // nullopt only when no worker is healthy
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "hashing/block_chain.h"
#include "hashing/prefix_index.h"
#include "util/result.h"

namespace kvroute::policy {

using hashing::WorkerId;

// What the router knows about one worker at decision time (a snapshot; reported fields may be stale).
struct WorkerView {
  WorkerId id = 0;
  bool healthy = true;
  // Router-tracked load.
  std::uint32_t in_flight = 0;                // requests sent and not finished
  std::uint64_t pending_prefill_tokens = 0;   // uncached prompt tokens sent and not yet past first token
  std::uint64_t active_decode_tokens = 0;     // context tokens of requests in decode
  // KV tokens the requests in flight will have allocated when they finish: per request its uncached prompt
  // tokens plus its output (max_tokens); the cached prefix blocks they share are resident and not counted. With
  // shared state, the other replicas' requests too (LoadShare).
  std::uint64_t inflight_kv_tokens = 0;
  // Live session bindings on the worker (those not expired), filled in for a request that opens a session, and
  // the seconds since a session was last bound to it anew (infinite: none yet, or not filled in).
  std::uint32_t sessions = 0;
  double session_opened_ago_s = std::numeric_limits<double>::infinity();
  // The same pending requests in estimated seconds, each priced when it was sent with prefill_seconds() of its
  // uncached tokens after its cached ones (policy/rate_learner.h): their sum, the oldest one's, and the time
  // since the worker last returned a first token (or since the first of them was sent, if later).
  double pending_prefill_s = 0;
  double oldest_prefill_s = 0;
  double prefill_elapsed_s = 0;
  // Reported by the worker (metrics), 0 when unknown.
  std::uint32_t running = 0;
  std::uint32_t waiting = 0;
  double kv_usage = 0.0;                      // fraction of KV blocks in use, 0..1
  std::uint64_t capacity_blocks = 0;          // KV capacity in blocks of block_tokens (0 = unknown)
  std::uint64_t reused_blocks = 0;            // blocks in the index that were hit again (eviction pricing)
  // Performance profile, learned online or from configuration.
  double prefill_tokens_per_s = 10000.0;      // P_w
  double transfer_tokens_per_s = 100000.0;    // X_w (CPU tier -> GPU)
  double decode_step_s = 0.02;                // time of one decode step at the current batch
  double decode_step_per_token_s = 0;         // what one more context token in the batch adds to a step
  double base_ttft_s = 0;                     // fixed part of TTFT (front end, first step), learned
  double ttft_correction = 1;                 // learned observed / expected TTFT (RateLearner), for reports
  std::uint32_t max_running = 256;            // running-sequence cap (batch size)
};

// Tokens a worker's KV pool lacks to admit `tokens` more now: the engine starts a waiting request only while its
// free blocks cover it, in arrival order (vLLM v1's scheduler; backends/sim/engine.cc), so the prefill queued there
// goes first. Free is the share of the pool not in use by requests, (1 - kv_usage) x capacity: vLLM's usage counts
// the blocks requests hold (cached blocks no request holds are free, evictable), and SGLang's sglang:token_usage is
// the same share (max_total_num_tokens less the available and the evictable tokens, over max_total_num_tokens, in
// its scheduler's token info). 0 while the pool has room, or when its size is unknown. kv_cost prices the wait for
// the shortfall (admission), and a session may leave its worker only when the pool lacks room for its turn (session
// affinity). It replaced a fitted threshold, usage >= 0.9 (docs/benchmarks.md, "The pool's room instead of a 90 %
// threshold").
inline double kv_room_shortfall(const WorkerView& w, double tokens_per_block, double tokens) {
  if (w.capacity_blocks == 0) return 0.0;
  const double pool = static_cast<double>(w.capacity_blocks) * tokens_per_block;
  const double free = std::max(0.0, 1.0 - w.kv_usage) * pool;
  return std::max(0.0, static_cast<double>(w.pending_prefill_tokens) + tokens - free);
}

// A worker's reported running and waiting counts brought up to now: `ended_now` counts the requests the routers
// saw end on it (this replica's and, with --shared-state, the others' as last read), `ended_at_report` the same
// count when its metrics were asked for. The requests that ended since leave the report's total, and the engine
// refills the running places they freed from its waiting line. Without this, a request that finished just after
// a poll still counted as running until the next (a second later), and a worker looked busy that was idle.
inline void settle_report(WorkerView& v, std::uint64_t ended_now, std::uint64_t ended_at_report) {
  if (ended_now <= ended_at_report) return;
  const std::uint64_t reported = std::uint64_t{v.running} + v.waiting;
  const std::uint64_t left = reported - std::min(reported, ended_now - ended_at_report);
  const auto running = static_cast<std::uint32_t>(std::min<std::uint64_t>(v.running, left));
  v.waiting = static_cast<std::uint32_t>(left - running);
  v.running = running;
}

// The load the other router replicas put on one worker (what they share through --shared-state; architecture
// section 11): a worker is priced by every replica's requests, so the daemon and the simulator both add the
// others' sum to a view with add_to() before the policy sees it.
//   LoadShare sum;  sum.add(from_replica_a);  sum.add(from_replica_b);  sum.add_to(view);
struct LoadShare {
  std::uint32_t in_flight = 0;
  std::uint64_t pending_prefill_tokens = 0;
  std::uint64_t active_decode_tokens = 0;
  double pending_prefill_s = 0;
  double oldest_prefill_s = 0;
  // How long the sender's prefill queue on the worker has gone without a first token (its
  // WorkerView::prefill_elapsed_s), 0 when that queue is empty: kv_cost credits the queue's progress with it,
  // and a replica whose own queue there is empty knows it only from the others. The largest counts.
  double prefill_elapsed_s = 0;
  std::uint64_t inflight_kv_tokens = 0;  // WorkerView::inflight_kv_tokens

  void add(const LoadShare& o) {
    in_flight += o.in_flight;
    inflight_kv_tokens += o.inflight_kv_tokens;
    pending_prefill_tokens += o.pending_prefill_tokens;
    active_decode_tokens += o.active_decode_tokens;
    pending_prefill_s += o.pending_prefill_s;
    oldest_prefill_s = std::max(oldest_prefill_s, o.oldest_prefill_s);
    prefill_elapsed_s = std::max(prefill_elapsed_s, o.prefill_elapsed_s);
  }
  void add_to(WorkerView& v) const {
    v.in_flight += in_flight;
    v.inflight_kv_tokens += inflight_kv_tokens;
    v.pending_prefill_tokens += pending_prefill_tokens;
    v.active_decode_tokens += active_decode_tokens;
    v.pending_prefill_s += pending_prefill_s;
    v.oldest_prefill_s = std::max(v.oldest_prefill_s, oldest_prefill_s);
    v.prefill_elapsed_s = std::max(v.prefill_elapsed_s, prefill_elapsed_s);
  }
  // What is left of the pending prefill `seconds` later: a worker works through its prefill queue at one second
  // of (estimated) prefill per second, so what another replica reported, or a request it routed, shrinks as
  // it ages; the tokens in proportion, and the time without a first token grows. The requests stay in flight
  // (their decode is not modelled here).
  void drain(double seconds) {
    if (!(seconds > 0) || !(pending_prefill_s > 0)) return;
    if (prefill_elapsed_s > 0) prefill_elapsed_s += seconds;  // still no first token, as far as anyone knows
    const double left = std::max(0.0, pending_prefill_s - seconds);
    const double tokens = static_cast<double>(pending_prefill_tokens) * (left / pending_prefill_s);
    pending_prefill_tokens = static_cast<std::uint64_t>(std::llround(tokens));
    pending_prefill_s = left;
    oldest_prefill_s = std::min(oldest_prefill_s, left);
  }
};

// One part of the others' load on a worker, and when it was learned (seconds on this replica's clock): a
// replica's published load when it was read, or a routed record when it arrived.
struct TimedShare {
  double at = 0;
  LoadShare load;
};

// The others' load on one worker as of `now`, from its parts. Their prefill is one queue on the worker, so it
// drains as a single-server queue does (Lindley's recursion, W' = max(0, W - elapsed) + arriving work, in the
// order the parts came): without it, a request routed by another replica still counted as queued until that
// replica's next published load, 25-50 ms later, long after a short prefill was done, and kv_cost sent the
// next request for that prefix elsewhere (tests/e2e/replicas_e2e_test.cc, precise mode).
LoadShare queued_at(std::vector<TimedShare> parts, double now);

// `blocks` leading blocks of a prompt as tokens: blocks x tokens per block, at most the prompt's tokens.
inline std::uint64_t tokens_of_blocks(std::uint64_t blocks, double tokens_per_block, std::uint64_t prompt_tokens) {
  // Rounded to nearest (as llround: the product is non-negative), inline; llround is a libm call, and kv_cost
  // asks this a few times per worker and request.
  const auto tokens = static_cast<std::uint64_t>(static_cast<double>(blocks) * tokens_per_block + 0.5);
  return std::min(tokens, prompt_tokens);
}

// Output tokens a request is expected to generate: its max_tokens, or, when it does not say, 256 (a prior:
// the order of a chat answer; it only sizes the decode and KV terms of kv_cost for such requests).
inline constexpr std::uint32_t kDefaultOutputTokens = 256;
inline std::uint32_t expected_output_tokens(std::uint32_t max_tokens) {
  return max_tokens > 0 ? max_tokens : kDefaultOutputTokens;
}

// RoutingContext::sequence of a router replica's `own`-th request (counted from 0) while `replicas` replicas run
// and this one is of rank `rank` among them (0 when alone): own x replicas + rank. Policies rotate ties and round
// robin with the sequence; replicas that each counted their own requests from 0 would all start that rotation at
// the same worker, so that requests reaching several of them at once (a burst, or every replica's first requests
// on a cold fleet) went to one idle worker. Interleaved, the replicas' sequences are the one router's count when
// arrivals go to them in turn.
inline std::uint64_t replica_sequence(std::uint64_t own, std::size_t rank, std::size_t replicas) {
  return replicas <= 1 ? own : own * replicas + std::min(rank, replicas - 1);
}

struct RoutingContext {
  const hashing::BlockChain* chain = nullptr;  // may be null (no routable prompt)
  double tokens_per_block = 16.0;              // tokens one chain block stands for
  std::uint64_t prompt_tokens = 0;             // estimated prompt length
  std::uint32_t max_tokens = 0;                // requested output length, 0 if unknown
  std::span<const WorkerView> workers;         // candidate workers (index i below refers to this span)
  const hashing::PrefixIndex::Match* match = nullptr;  // indexed by WorkerView::id; may be null
  std::optional<std::size_t> preferred;        // session-bound worker, index into workers
  std::string_view affinity_key;               // text some baselines hash (first user message, model)
  std::uint64_t sequence = 0;                  // request number, for round robin
  std::uint64_t random = 0;                    // a uniform random draw for this request
  // The largest context of their own that sessions' later turns recently had (own_context_tokens(), over the
  // router's last kFleetTailWindow of them), 0 while unknown: kv_cost weighs a session opening's balance with it.
  double session_context_tokens = 0;
  // The means of the fleet's recent TTFTs (at first tokens), inter-token and end-to-end latencies (at completions;
  // policy/recent_quantile.h, RecentLatencies), 0 while unknown: the scales kv_cost weighs a decision's effect on
  // each of them with.
  struct FleetMeans {
    double ttft_s = 0, itl_s = 0, e2e_s = 0;
    bool known() const { return ttft_s > 0 && itl_s > 0 && e2e_s > 0; }
  } fleet_means;
  // The request carries a session key that is bound to no worker yet: the worker it goes to keeps the session's
  // later turns (session affinity), so the pick commits more than this request.
  bool opens_session = false;

  std::uint32_t matched_blocks(std::size_t i) const { return match ? match->of(workers[i].id) : 0; }
  std::uint32_t matched_cpu_blocks(std::size_t i) const { return match ? match->cpu_of(workers[i].id) : 0; }
  std::uint64_t matched_tokens(std::size_t i) const {
    return tokens_of_blocks(matched_blocks(i), tokens_per_block, prompt_tokens);
  }
};

// Of a request continuing a session (ctx.preferred set), the tokens of its context no other worker holds: the
// prompt and its expected output, less the longest match on any other worker (the shared prefix: a system prompt,
// tools, a document). That is what the session keeps on its worker alone. 0 for any other request.
double own_context_tokens(const RoutingContext& ctx);

// kPreviousResponse: set by the router, not a policy (a Responses API request continuing a stored response).
enum class Reason : std::uint8_t { kPrefixHit, kSession, kLoadFallback, kCold, kOnlyChoice, kPreviousResponse };
std::string_view reason_name(Reason r);

struct Pick {
  std::size_t worker = 0;                      // index into RoutingContext::workers
  Reason reason = Reason::kCold;
  std::uint64_t predicted_cached_tokens = 0;
  double estimate_s = 0.0;                     // predicted TTFT, when the policy models it (else 0)
  double itl_estimate_s = 0.0;                 // predicted mean inter-token latency there (else 0)
  // The TTFT the policy expects, for reporting (RoutingPolicy::expected_ttft), 0 when it has no such model.
  // estimate_s is what routing compares; this one drops what is priced for routing's sake (see kv_cost).
  double expected_ttft_s = 0.0;
  // Another worker to compute the request's prompt on as well, off this request's path (kv_cost's bought copy of a
  // prefix, policy/kv_cost.cc): the router sends it the prompt alone, for one output token, and discards the answer.
  std::optional<std::size_t> warm{};  // index into RoutingContext::workers
  // The worker the session this request opens is bound to, when it is not `worker` (kv_cost: the first turn goes to
  // its prefix's holder, the session where the balance wants it, and `warm` copies the prompt there).
  std::optional<std::size_t> session_worker{};  // index into RoutingContext::workers
};

// The TTFT the router reports before the learned correction: the pick's expected TTFT, or, for a policy
// without one, its estimate plus the worker's learned fixed part (WorkerView::base_ttft_s: front end, first
// step), which estimates leave out because it is the same on every worker. 0 when the pick has no estimate.
inline double uncorrected_ttft_estimate(const Pick& pick, const WorkerView& chosen) {
  if (pick.expected_ttft_s > 0) return pick.expected_ttft_s;
  return pick.estimate_s > 0 ? pick.estimate_s + chosen.base_ttft_s : 0.0;
}

// The TTFT estimate as the router reports it (the kvroute_estimate_ratio histogram, the benchmark's calibration):
// uncorrected_ttft_estimate(), times what the chosen worker's past ones were off by (its learned observed /
// estimated ratio, WorkerView::ttft_correction, the geometric mean over recent requests). The learner learns
// from the uncorrected value (RateObservation::estimated_ttft_s), so the correction does not chase itself.
// The fixed part and the expected (not priced) TTFT matter more than the ratio: on the benchmark family the
// routing estimate alone, corrected so, was off by a median 26 % (docs/benchmarks.md, "Calibration"), because a
// ratio cannot fit a fixed part that dominates short requests and a queue overstated on loaded workers at once.
inline double corrected_ttft_estimate(const Pick& pick, const WorkerView& chosen) {
  return uncorrected_ttft_estimate(pick, chosen) * chosen.ttft_correction;
}

class RoutingPolicy {
 public:
  virtual ~RoutingPolicy() = default;
  virtual std::string_view name() const = 0;
  // The chosen worker among the healthy ones, or nullopt when none is healthy.
  virtual std::optional<Pick> pick(const RoutingContext& ctx) const = 0;
  // Predicted TTFT of sending the request to workers[i]; NaN when the policy has no latency model. Session
  // affinity uses it to decide whether a bound worker is still good enough.
  virtual double estimate(const RoutingContext& ctx, std::size_t i) const;
  // Predicted mean inter-token latency of the request on workers[i]; NaN without a latency model.
  virtual double itl_estimate(const RoutingContext& ctx, std::size_t i) const;
  // The TTFT the request is expected to have on workers[i], for reporting (Pick::expected_ttft_s); NaN
  // without such a model.
  virtual double expected_ttft(const RoutingContext& ctx, std::size_t i) const;
  // Whether the policy reads prefix matches (the router skips matching for prefix-blind policies).
  virtual bool uses_prefix_match() const { return false; }
  // Whether the router may hold a request sent where its prefix is still being computed by an earlier one
  // until that prefix lands (Router::prefix_held, router/router.h). A cost of kv_cost's own; the published policies
  // reimplemented here send every request at once.
  virtual bool waits_for_computing_prefix() const { return false; }
};

struct PolicyOptions {
  // kv_cost weights (architecture section 7).
  double alpha = 1.0;   // weight of the recompute cost the request causes (evicted reused blocks, duplicates)
  // Share of this request's decode that a request already running on the worker overlaps (kv_cost prices the
  // inter-token latency it adds to them for that long): 0.5, derived, since a running request is on average half
  // way through its own decode.
  double beta = 0.5;
  // Session affinity: off a bound worker whose KV pool is full (policy/session_affinity.cc; with room, it is
  // always kept), move only when its estimate exceeds the best by more than this. 0.25 s,
  // measured with the move guard of policy/session_affinity.cc on the saturated multi_turn benchmark cell
  // over five seeds: mean / p99 TTFT 0.39 / 5.0 s (0.3 s: 0.40 / 5.6; 0.5 s: 0.45 / 5.8; 0.1 s and 1 s worse
  // on seed 1). Moves only go to workers with headroom, so a chat can leave a worker that starts queueing
  // early without tipping another over.
  double session_margin_s = 0.25;
  // cache_aware (SGLang router defaults).
  double cache_threshold = 0.3;
  double balance_abs_threshold = 64;
  double balance_rel_threshold = 1.5;
  // chwbl (KubeAI PrefixHash defaults).
  int chwbl_replicas = 256;
  double chwbl_load_factor = 1.25;
  std::size_t chwbl_prefix_chars = 100;
};

// All policy names, in the order the benchmark reports them.
const std::vector<std::string>& policy_names();
// A policy by name, wrapped in session affinity; an error lists the valid names.
Result<std::unique_ptr<RoutingPolicy>> make_policy(std::string_view name, const PolicyOptions& options);

// Helpers shared by policies.
namespace detail {
// Index of the healthy worker with the fewest in-flight requests (ties: lowest index); nullopt if none.
std::optional<std::size_t> least_loaded(const RoutingContext& ctx);
std::size_t healthy_count(const RoutingContext& ctx);
}  // namespace detail

}  // namespace kvroute::policy
