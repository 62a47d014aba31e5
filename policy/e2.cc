// e2: Preble's E2 scheduling (Srivatsa et al., "Preble: Efficient Distributed Prompt Scheduling for LLM
// Serving", ICLR 2025). Exploit when the prefix is worth more than the rest: if some workers hold more cached
// tokens of the prompt than it has uncached ones, send it to the least loaded of them. Otherwise explore:
// the worker with the lowest load cost, where load cost = the prefill and decode work it already has
// (Preble's L) + the prefill this request would add there (Preble's P), all in seconds.
#include "policy/policies.h"

#include <limits>

namespace kvroute::policy {
namespace {

class E2 final : public RoutingPolicy {
 public:
  std::string_view name() const override { return "e2"; }
  bool uses_prefix_match() const override { return true; }

  static double load_cost(const RoutingContext& ctx, std::size_t i) {
    const WorkerView& w = ctx.workers[i];
    const double p = w.prefill_tokens_per_s > 0 ? w.prefill_tokens_per_s : 1.0;
    const double existing = w.pending_prefill_tokens / p + (w.running + w.in_flight) * w.decode_step_s;
    const double added = static_cast<double>(ctx.prompt_tokens - ctx.matched_tokens(i)) / p;
    return existing + added;
  }

  std::optional<Pick> pick(const RoutingContext& ctx) const override {
    std::optional<std::size_t> exploit, explore;
    double explore_cost = std::numeric_limits<double>::infinity();
    for (std::size_t k = 0; k < ctx.workers.size(); ++k) {
      const std::size_t i = (k + ctx.sequence) % ctx.workers.size();
      const WorkerView& w = ctx.workers[i];
      if (!w.healthy) continue;
      const std::uint64_t cached = ctx.matched_tokens(i);
      if (cached > ctx.prompt_tokens - cached) {
        if (!exploit || w.in_flight < ctx.workers[*exploit].in_flight) exploit = i;
      }
      const double c = load_cost(ctx, i);
      if (!explore || c < explore_cost) {
        explore = i;
        explore_cost = c;
      }
    }
    if (exploit) return Pick{*exploit, Reason::kPrefixHit, ctx.matched_tokens(*exploit), 0.0};
    if (!explore) return std::nullopt;
    const std::uint64_t hit = ctx.matched_tokens(*explore);
    return Pick{*explore, hit ? Reason::kLoadFallback : Reason::kCold, hit, 0.0};
  }
};

}  // namespace

std::unique_ptr<RoutingPolicy> make_e2(const PolicyOptions&) { return std::make_unique<E2>(); }

}  // namespace kvroute::policy
