// kv_cost: kvroute's own policy (architecture section 7). Every healthy worker w is priced in seconds of latency
// summed over the users it affects, the request's own and that of the requests it joins, and the cheapest wins.
// With T prompt tokens, g and c of them cached on w's GPU and CPU tier, m = T - g - c to compute, `out` output
// tokens (max_tokens, else kDefaultOutputTokens), P, X, the decode step and its correction learned per worker
// (policy/rate_learner.h, starting from the profile of architecture section 8):
//
//   prefill  = prefill_seconds(m, T - m, P) + c / X           attention makes late tokens dearer (rate_learner.h)
//   queue    = max(pending / P, prefill_seconds(pending, 0, P), sum of the pending requests' own estimates)
//              - min(time since w's last first token, the oldest pending estimate)   (the head is partly done)
//            + ceil((pending + m) / chunk) x step0            chunked prefill: every step of it also runs the
//                                                              decode batch (vLLM's max_num_batched_tokens)
//   life     = out x step                                      how long a request holds a slot and its KV
//   admit    = max(seqs, kv): the engine starts a request only while fewer than max_num_seqs run and its KV pool
//              has room (vLLM's scheduler). seqs = (in_flight + 1 - cap) / cap x life: slots free at cap / life
//              per second. kv = (need - pool) / pool x life, need = held + m + out, held = the larger of the KV
//              the in-flight requests will have allocated at their end (uncached prompt + output, router-tracked
//              at once: WorkerView::inflight_kv_tokens) and the pool in use as last polled (kv_cache_usage_perc:
//              it also counts the cached context the running requests pin, which the router cannot split from
//              prefixes they share); the pool turns over once per request lifetime. Past the pool, vLLM preempts
//              and recomputes, which costs the same wait.
//   TTFT     = (base + queue + prefill + admit) x correction   correction = the worker's learned observed /
//                                                              estimated TTFT (RateLearner, self-correction)
//   step     = step0 + per_token x (T + out / 2)               the decode step of the batch it joins, its own KV
//                                                              added (architecture section 8: memory-bound decode
//                                                              reads the weights and every running sequence's KV)
//   own      = TTFT + (out - 1) x step                          its end-to-end latency
//   others   = n x (prefill + beta x out x per_token x (T + out / 2))
//              n = requests that share w's steps (in flight, at most max_num_seqs). Its prefill chunks lengthen
//              the steps all of them are in by the prefill time; its KV lengthens each of their steps while they
//              overlap, beta = 0.5 of its decode on average (a running request is, on average, half way through)
//   evict    = blocks it computes x share of w's capacity holding blocks that were hit again x recompute time of
//              a block (a warm cache evicts one block per block computed; docs/benchmarks.md)
//   cost     = own + others + alpha x evict                    alpha = 1: a recomputed second counts once
//
// Herding: every load term is the router's own count, updated the moment a request is sent (in flight, pending
// prefill, in-flight KV), so requests arriving between two polls see each other; of the polled metrics only
// KV usage is read, as a floor under the router's own count. Exploration: a worker without samples takes the fleet's learned rates
// (RateLearner::apply), so a prior is never left uncorrected. Ties (equal cost) go to the worker with fewer
// requests in flight. Blocks a worker evicted are not in the index, so they count as recompute, never as hits.
// docs/benchmarks.md lists which constants are derived and which learned.
#include "policy/policies.h"
#include "policy/rate_learner.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace kvroute::policy {
namespace {

// Chunked-prefill token budget per engine step: vLLM V1's default max_num_batched_tokens with chunked prefill
// on large GPUs (the simulated engine's default too); a smaller budget only makes the decode part larger.
constexpr double kChunkTokens = 8192.0;

class KvCost final : public RoutingPolicy {
 public:
  explicit KvCost(const PolicyOptions& o) : o_(o) {}
  std::string_view name() const override { return "kv_cost"; }
  bool uses_prefix_match() const override { return true; }
  bool waits_for_computing_prefix() const override { return true; }

  struct Terms {
    double ttft = 0, step = 0, own = 0, others = 0, evict = 0;
    double cost(const PolicyOptions& o) const { return own + others + o.alpha * evict; }
  };

  Terms terms(const RoutingContext& ctx, std::size_t i) const {
    const WorkerView& w = ctx.workers[i];
    const double tpb = ctx.tokens_per_block > 0 ? ctx.tokens_per_block : 16.0;
    const double P = std::max(w.prefill_tokens_per_s, 1.0);
    const double X = std::max(w.transfer_tokens_per_s, 1.0);
    const double T = static_cast<double>(ctx.prompt_tokens);
    const double matched = static_cast<double>(ctx.matched_tokens(i));
    const double c = std::min(matched, ctx.matched_cpu_blocks(i) * tpb);
    const double m = std::max(0.0, T - matched);
    const double out = expected_output_tokens(ctx.max_tokens);
    const double step0 = std::max(w.decode_step_s, 0.0);
    const double own_kv = std::max(w.decode_step_per_token_s, 0.0) * (T + out / 2);
    const double pending = static_cast<double>(w.pending_prefill_tokens);
    const double cap = static_cast<double>(std::max<std::uint32_t>(w.max_running, 1));
    Terms t;
    t.step = step0 + own_kv;

    const double prefill = prefill_seconds(m, T - m, P) + c / X;
    double queued = std::max({pending / P, prefill_seconds(pending, 0.0, P), w.pending_prefill_s});
    if (queued > 0) queued = std::max(0.0, queued - std::min(w.prefill_elapsed_s, w.oldest_prefill_s));
    const double decoding = (w.active_decode_tokens > 0 || w.in_flight > 0) ? 1.0 : 0.0;
    const double queue = queued + decoding * std::ceil((pending + m) / kChunkTokens) * step0;

    const double life = out * t.step;
    double admit = std::max(0.0, static_cast<double>(w.in_flight) + 1.0 - cap) / cap * life;
    if (w.capacity_blocks > 0) {
      const double pool = static_cast<double>(w.capacity_blocks) * tpb;
      const double held = std::max(static_cast<double>(w.inflight_kv_tokens), std::clamp(w.kv_usage, 0.0, 1.0) * pool);
      const double need = held + m + out;
      admit = std::max(admit, std::max(0.0, need - pool) / pool * life);
    }
    t.ttft = (std::max(w.base_ttft_s, 0.0) + queue + prefill + admit) * std::max(w.ttft_correction, 0.0);
    t.own = t.ttft + std::max(out - 1.0, 0.0) * t.step;
    const double sharing = std::min(static_cast<double>(w.in_flight), cap);
    t.others = sharing * (prefill + o_.beta * out * own_kv);

    if (w.capacity_blocks > 0) {
      const double reuse = std::min(1.0, static_cast<double>(w.reused_blocks) / static_cast<double>(w.capacity_blocks));
      t.evict = std::ceil(m / tpb) * reuse * tpb / P;
    }
    return t;
  }

  double estimate(const RoutingContext& ctx, std::size_t i) const override { return terms(ctx, i).ttft; }
  double itl_estimate(const RoutingContext& ctx, std::size_t i) const override { return terms(ctx, i).step; }

  std::optional<Pick> pick(const RoutingContext& ctx) const override {
    std::uint64_t most_matched = 0;
    std::optional<std::size_t> best;
    Terms best_terms;
    double best_cost = std::numeric_limits<double>::infinity();
    for (std::size_t k = 0; k < ctx.workers.size(); ++k) {
      const std::size_t i = (k + ctx.sequence) % ctx.workers.size();
      const WorkerView& w = ctx.workers[i];
      if (!w.healthy) continue;
      most_matched = std::max(most_matched, ctx.matched_tokens(i));
      const Terms t = terms(ctx, i);
      const double c = t.cost(o_);
      if (!best || c < best_cost || (c == best_cost && w.in_flight < ctx.workers[*best].in_flight)) {
        best = i;
        best_cost = c;
        best_terms = t;
      }
    }
    if (!best) return std::nullopt;
    const std::uint64_t hit = ctx.matched_tokens(*best);
    Reason reason = Reason::kCold;
    if (hit > 0 && hit == most_matched) reason = Reason::kPrefixHit;
    else if (most_matched > 0) reason = Reason::kLoadFallback;
    return Pick{*best, reason, hit, best_terms.ttft, best_terms.step};
  }

 private:
  PolicyOptions o_;
};

}  // namespace

std::unique_ptr<RoutingPolicy> make_kv_cost(const PolicyOptions& options) {
  return std::make_unique<KvCost>(options);
}

}  // namespace kvroute::policy
