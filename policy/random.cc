// random: a uniformly random healthy worker, drawn from the context's per-request random number.
#include "policy/policies.h"

namespace kvroute::policy {
namespace {

class Random final : public RoutingPolicy {
 public:
  std::string_view name() const override { return "random"; }
  std::optional<Pick> pick(const RoutingContext& ctx) const override {
    const std::size_t healthy = detail::healthy_count(ctx);
    if (healthy == 0) return std::nullopt;
    std::size_t k = ctx.random % healthy;
    for (std::size_t i = 0; i < ctx.workers.size(); ++i) {
      if (!ctx.workers[i].healthy) continue;
      if (k-- == 0) return Pick{i, healthy == 1 ? Reason::kOnlyChoice : Reason::kCold, ctx.matched_tokens(i), 0.0};
    }
    return std::nullopt;
  }
};

}  // namespace

std::unique_ptr<RoutingPolicy> make_random() { return std::make_unique<Random>(); }

}  // namespace kvroute::policy
