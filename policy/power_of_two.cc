// power_of_two: "the power of two random choices" (Mitzenmacher, 2001): sample two distinct healthy workers
// and send the request to the one with fewer in-flight requests.
#include "policy/policies.h"

#include <vector>

namespace kvroute::policy {
namespace {

class PowerOfTwo final : public RoutingPolicy {
 public:
  std::string_view name() const override { return "power_of_two"; }
  std::optional<Pick> pick(const RoutingContext& ctx) const override {
    const std::size_t healthy = detail::healthy_count(ctx);
    if (healthy == 0) return std::nullopt;
    // Two draws from one 64-bit random number: the high and low halves.
    const std::size_t a = (ctx.random >> 32) % healthy;
    std::size_t b = (ctx.random & 0xffffffffu) % healthy;
    if (healthy > 1 && b == a) b = (b + 1) % healthy;
    std::size_t ia = 0, ib = 0;
    for (std::size_t i = 0, k = 0; i < ctx.workers.size(); ++i) {
      if (!ctx.workers[i].healthy) continue;
      if (k == a) ia = i;
      if (k == b) ib = i;
      ++k;
    }
    const std::size_t pick = ctx.workers[ib].in_flight < ctx.workers[ia].in_flight ? ib : ia;
    return Pick{pick, healthy == 1 ? Reason::kOnlyChoice : Reason::kLoadFallback, ctx.matched_tokens(pick), 0.0};
  }
};

}  // namespace

std::unique_ptr<RoutingPolicy> make_power_of_two() { return std::make_unique<PowerOfTwo>(); }

}  // namespace kvroute::policy
