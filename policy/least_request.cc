// least_request: the healthy worker with the fewest in-flight requests (Envoy's LEAST_REQUEST with full
// scan; ties rotate with the request sequence).
#include "policy/policies.h"

namespace kvroute::policy {
namespace {

class LeastRequest final : public RoutingPolicy {
 public:
  std::string_view name() const override { return "least_request"; }
  std::optional<Pick> pick(const RoutingContext& ctx) const override {
    auto i = detail::least_loaded(ctx);
    if (!i) return std::nullopt;
    return Pick{*i, Reason::kLoadFallback, ctx.matched_tokens(*i), 0.0};
  }
};

}  // namespace

std::unique_ptr<RoutingPolicy> make_least_request() { return std::make_unique<LeastRequest>(); }

}  // namespace kvroute::policy
