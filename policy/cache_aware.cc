// cache_aware: SGLang model gateway's cache-aware policy (sgl-router, policies/cache_aware, defaults
// cache_threshold 0.3, balance_abs_threshold 64, balance_rel_threshold 1.5).
//
// 1. Load check: the system is imbalanced when (max_load - min_load) > balance_abs_threshold and
//    max_load > balance_rel_threshold * min_load, loads being in-flight requests. Imbalanced: least loaded.
// 2. Otherwise find the worker with the longest prefix match; if matched / prompt length > cache_threshold,
//    send it there (cache hit), else to the least loaded worker (SGLang sends it to the worker with the
//    smallest tree; we use load, as the design brief specifies).
// SGLang matches characters in an approximate radix tree of what it routed; kvroute feeds the same decision
// from its PrefixIndex in approximate mode, so the match is at block granularity (64 bytes or 16 tokens).
#include "policy/policies.h"

#include <algorithm>

namespace kvroute::policy {
namespace {

class CacheAware final : public RoutingPolicy {
 public:
  explicit CacheAware(const PolicyOptions& o) : o_(o) {}
  std::string_view name() const override { return "cache_aware"; }
  bool uses_prefix_match() const override { return true; }

  std::optional<Pick> pick(const RoutingContext& ctx) const override {
    auto least = detail::least_loaded(ctx);
    if (!least) return std::nullopt;
    std::uint32_t max_load = 0, min_load = UINT32_MAX;
    std::optional<std::size_t> best_match;
    std::uint64_t best_tokens = 0;
    for (std::size_t k = 0; k < ctx.workers.size(); ++k) {
      const std::size_t i = (k + ctx.sequence) % ctx.workers.size();
      const WorkerView& w = ctx.workers[i];
      if (!w.healthy) continue;
      max_load = std::max(max_load, w.in_flight);
      min_load = std::min(min_load, w.in_flight);
      const std::uint64_t t = ctx.matched_tokens(i);
      if (!best_match || t > best_tokens) {
        best_match = i;
        best_tokens = t;
      }
    }
    const bool imbalanced = (max_load - min_load) > o_.balance_abs_threshold &&
                            max_load > o_.balance_rel_threshold * min_load;
    if (imbalanced) return Pick{*least, Reason::kLoadFallback, ctx.matched_tokens(*least), 0.0};
    const double rate = ctx.prompt_tokens ? static_cast<double>(best_tokens) / ctx.prompt_tokens : 0.0;
    if (rate > o_.cache_threshold) return Pick{*best_match, Reason::kPrefixHit, best_tokens, 0.0};
    return Pick{*least, best_tokens ? Reason::kLoadFallback : Reason::kCold, ctx.matched_tokens(*least), 0.0};
  }

 private:
  PolicyOptions o_;
};

}  // namespace

std::unique_ptr<RoutingPolicy> make_cache_aware(const PolicyOptions& options) {
  return std::make_unique<CacheAware>(options);
}

}  // namespace kvroute::policy
