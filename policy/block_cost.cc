// block_cost: NVIDIA Dynamo's KV router cost (components/router, KvScheduler default: overlap_score_weight 1,
// temperature 0): cost = overlap_weight x prefill blocks the request would compute (blocks not already
// cached) + decode blocks the worker already holds active; the lowest cost wins, ties by load.
#include "policy/policies.h"

#include <cmath>
#include <limits>

namespace kvroute::policy {
namespace {

class BlockCost final : public RoutingPolicy {
 public:
  std::string_view name() const override { return "block_cost"; }
  bool uses_prefix_match() const override { return true; }

  double cost(const RoutingContext& ctx, std::size_t i) const {
    const WorkerView& w = ctx.workers[i];
    const double tpb = ctx.tokens_per_block > 0 ? ctx.tokens_per_block : 16.0;
    const double prefill_blocks = std::ceil(static_cast<double>(ctx.prompt_tokens - ctx.matched_tokens(i)) / tpb);
    const double active_blocks =
        std::ceil(static_cast<double>(w.active_decode_tokens + w.pending_prefill_tokens) / tpb);
    return prefill_blocks + active_blocks;
  }

  std::optional<Pick> pick(const RoutingContext& ctx) const override {
    std::optional<std::size_t> best;
    double best_cost = std::numeric_limits<double>::infinity();
    for (std::size_t k = 0; k < ctx.workers.size(); ++k) {
      const std::size_t i = (k + ctx.sequence) % ctx.workers.size();
      if (!ctx.workers[i].healthy) continue;
      const double c = cost(ctx, i);
      if (!best || c < best_cost || (c == best_cost && ctx.workers[i].in_flight < ctx.workers[*best].in_flight)) {
        best = i;
        best_cost = c;
      }
    }
    if (!best) return std::nullopt;
    const std::uint64_t hit = ctx.matched_tokens(*best);
    return Pick{*best, hit ? Reason::kPrefixHit : Reason::kCold, hit, 0.0};
  }
};

}  // namespace

std::unique_ptr<RoutingPolicy> make_block_cost(const PolicyOptions&) { return std::make_unique<BlockCost>(); }

}  // namespace kvroute::policy
