// weighted_scorers: llm-d inference scheduler, "precise prefix-cache" profile: the weighted sum of three
// scorers, highest wins:
//   2 x prefix-cache scorer (fraction of the prompt's blocks the worker holds)
//   1 x kv-cache-utilization scorer (1 - KV usage)
//   1 x queue scorer ((max_q - q) / (max_q - min_q) over the candidates; 1 when all queues are equal)
// Queue length is the worker's reported waiting queue, as llm-d reads it from the engine's metrics.
#include "policy/policies.h"

#include <algorithm>
#include <limits>

namespace kvroute::policy {
namespace {

class WeightedScorers final : public RoutingPolicy {
 public:
  std::string_view name() const override { return "weighted_scorers"; }
  bool uses_prefix_match() const override { return true; }

  std::optional<Pick> pick(const RoutingContext& ctx) const override {
    double min_q = std::numeric_limits<double>::infinity(), max_q = -min_q;
    for (const auto& w : ctx.workers) {
      if (!w.healthy) continue;
      min_q = std::min<double>(min_q, w.waiting);
      max_q = std::max<double>(max_q, w.waiting);
    }
    const double chain_blocks = ctx.chain ? static_cast<double>(ctx.chain->hashes.size()) : 0.0;
    std::optional<std::size_t> best;
    double best_score = -std::numeric_limits<double>::infinity();
    for (std::size_t k = 0; k < ctx.workers.size(); ++k) {
      const std::size_t i = (k + ctx.sequence) % ctx.workers.size();
      const WorkerView& w = ctx.workers[i];
      if (!w.healthy) continue;
      const double prefix = chain_blocks > 0 ? ctx.matched_blocks(i) / chain_blocks : 0.0;
      const double kv = 1.0 - std::clamp(w.kv_usage, 0.0, 1.0);
      const double queue = max_q > min_q ? (max_q - w.waiting) / (max_q - min_q) : 1.0;
      const double score = 2.0 * prefix + kv + queue;
      if (!best || score > best_score) {
        best = i;
        best_score = score;
      }
    }
    if (!best) return std::nullopt;
    const std::uint64_t hit = ctx.matched_tokens(*best);
    return Pick{*best, hit ? Reason::kPrefixHit : Reason::kCold, hit, 0.0};
  }
};

}  // namespace

std::unique_ptr<RoutingPolicy> make_weighted_scorers(const PolicyOptions&) {
  return std::make_unique<WeightedScorers>();
}

}  // namespace kvroute::policy
