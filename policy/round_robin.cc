// round_robin: the classic rotation over healthy workers. The rotation position is the request's sequence
// number from the context, so pick() stays a pure function.
#include "policy/policies.h"

namespace kvroute::policy {
namespace {

class RoundRobin final : public RoutingPolicy {
 public:
  std::string_view name() const override { return "round_robin"; }
  std::optional<Pick> pick(const RoutingContext& ctx) const override {
    const std::size_t healthy = detail::healthy_count(ctx);
    if (healthy == 0) return std::nullopt;
    std::size_t k = ctx.sequence % healthy;
    for (std::size_t i = 0; i < ctx.workers.size(); ++i) {
      if (!ctx.workers[i].healthy) continue;
      if (k-- == 0) return Pick{i, healthy == 1 ? Reason::kOnlyChoice : Reason::kCold, ctx.matched_tokens(i), 0.0};
    }
    return std::nullopt;
  }
};

}  // namespace

std::unique_ptr<RoutingPolicy> make_round_robin() { return std::make_unique<RoundRobin>(); }

}  // namespace kvroute::policy
