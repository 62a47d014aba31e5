// Session affinity (architecture section 6): a decorator over any policy. When the request's session is bound
// to a healthy worker, that worker is kept unless the inner policy's latency estimate for it exceeds the
// estimate of the inner policy's own pick by more than session_margin_s. Policies without a latency model
// (estimate() is NaN) always keep the bound worker while it is healthy.
#include "policy/policies.h"

#include <cmath>

namespace kvroute::policy {
namespace {

class SessionAffinity final : public RoutingPolicy {
 public:
  SessionAffinity(std::unique_ptr<RoutingPolicy> inner, const PolicyOptions& o)
      : inner_(std::move(inner)), margin_(o.session_margin_s) {}

  std::string_view name() const override { return inner_->name(); }
  bool uses_prefix_match() const override { return inner_->uses_prefix_match(); }
  double estimate(const RoutingContext& ctx, std::size_t i) const override { return inner_->estimate(ctx, i); }

  std::optional<Pick> pick(const RoutingContext& ctx) const override {
    std::optional<Pick> best = inner_->pick(ctx);
    if (!ctx.preferred || *ctx.preferred >= ctx.workers.size() || !ctx.workers[*ctx.preferred].healthy) return best;
    const std::size_t bound = *ctx.preferred;
    if (!best || best->worker == bound) {
      if (best) best->reason = Reason::kSession;
      return best;
    }
    const double bound_estimate = inner_->estimate(ctx, bound);
    if (std::isnan(bound_estimate) || bound_estimate <= best->estimate_s + margin_) {
      return Pick{bound, Reason::kSession, ctx.matched_tokens(bound), std::isnan(bound_estimate) ? 0.0 : bound_estimate};
    }
    return best;
  }

 private:
  std::unique_ptr<RoutingPolicy> inner_;
  double margin_;
};

}  // namespace

std::unique_ptr<RoutingPolicy> with_session_affinity(std::unique_ptr<RoutingPolicy> inner,
                                                     const PolicyOptions& options) {
  return std::make_unique<SessionAffinity>(std::move(inner), options);
}

}  // namespace kvroute::policy
