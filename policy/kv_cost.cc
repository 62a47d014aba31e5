// kv_cost: kvroute's own policy (architecture section 7). Every healthy worker is priced in seconds of
// expected latency and the cheapest wins:
//
//   g, c      tokens of the prompt matched on the worker's GPU and CPU tier; m = T - g - c to recompute
//   prefill = m / P + c / X                          (P prefill tokens/s, X CPU->GPU tokens/s)
//   queue   = pending prefill tokens / P             (work admitted ahead of this request)
//           + ceil((pending + m) / chunk) x decode step   (each chunked-prefill step also runs the decode batch)
//   evict   = blocks the request would push out x share of the worker's blocks that get reused x recompute
//             time of one block
//   delay   = m / P when the worker has requests decoding (chunked prefill stretches their steps)
//   cost    = queue + prefill + alpha x evict + beta x delay
//
// P, X and the step time come from the WorkerView: learned online from completed requests, starting from the
// worker's profile. Blocks a worker evicted are not in the index, so they count as recompute, never as hits.
#include "policy/policies.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace kvroute::policy {
namespace {

// Chunked-prefill token budget per engine step (vLLM's default max_num_batched_tokens for chunked prefill
// on large GPUs is 8192 in V1; smaller budgets only make the decode term larger).
constexpr double kChunkTokens = 8192.0;

class KvCost final : public RoutingPolicy {
 public:
  explicit KvCost(const PolicyOptions& o) : o_(o) {}
  std::string_view name() const override { return "kv_cost"; }
  bool uses_prefix_match() const override { return true; }

  struct Terms {
    double ttft = 0, evict = 0, delay = 0;
    double cost(const PolicyOptions& o) const { return ttft + o.alpha * evict + o.beta * delay; }
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
    Terms t;
    const double prefill = m / P + c / X;
    const double pending = static_cast<double>(w.pending_prefill_tokens);
    const double steps = std::ceil((pending + m) / kChunkTokens);
    const bool decoding = w.active_decode_tokens > 0 || w.running > 0;
    const double queue = pending / P + (decoding ? steps * w.decode_step_s : 0.0);
    t.ttft = queue + prefill;
    if (w.capacity_blocks > 0) {
      const double used = std::clamp(w.kv_usage, 0.0, 1.0) * static_cast<double>(w.capacity_blocks);
      const double free_blocks = static_cast<double>(w.capacity_blocks) - used;
      const double need = std::ceil(m / tpb);
      if (need > free_blocks && used > 0) {
        const double reuse = std::min(1.0, static_cast<double>(w.reused_blocks) / used);
        t.evict = (need - free_blocks) * reuse * tpb / P;
      }
    }
    t.delay = decoding ? m / P : 0.0;
    return t;
  }

  double estimate(const RoutingContext& ctx, std::size_t i) const override { return terms(ctx, i).ttft; }

  std::optional<Pick> pick(const RoutingContext& ctx) const override {
    std::optional<std::size_t> best;
    double best_cost = std::numeric_limits<double>::infinity(), best_ttft = 0;
    std::uint64_t most_matched = 0;
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
        best_ttft = t.ttft;
      }
    }
    if (!best) return std::nullopt;
    const std::uint64_t hit = ctx.matched_tokens(*best);
    Reason reason = Reason::kCold;
    if (hit > 0 && hit == most_matched) reason = Reason::kPrefixHit;
    else if (most_matched > 0) reason = Reason::kLoadFallback;
    return Pick{*best, reason, hit, best_ttft};
  }

 private:
  PolicyOptions o_;
};

}  // namespace

std::unique_ptr<RoutingPolicy> make_kv_cost(const PolicyOptions& options) {
  return std::make_unique<KvCost>(options);
}

}  // namespace kvroute::policy
