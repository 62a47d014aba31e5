// chwbl: consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam, SODA 2018) as KubeAI's
// PrefixHash load balancer applies it: the key is (model, first 100 characters of the first user message),
// each worker owns 256 virtual nodes on a 64-bit ring, and the request walks clockwise from the key's hash
// to the first worker whose in-flight load stays within load_factor (1.25) x the mean load.
#include "policy/policies.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace kvroute::policy {
namespace {

class Chwbl final : public RoutingPolicy {
 public:
  explicit Chwbl(const PolicyOptions& o) : o_(o) {}
  std::string_view name() const override { return "chwbl"; }

  std::optional<Pick> pick(const RoutingContext& ctx) const override {
    const std::size_t healthy = detail::healthy_count(ctx);
    if (healthy == 0) return std::nullopt;
    std::uint64_t total = 0;
    for (const auto& w : ctx.workers) total += w.healthy ? w.in_flight : 0;
    // KubeAI: a worker may take the request while its load + 1 <= ceil(load_factor * (total + 1) / n).
    const double bound = std::ceil(o_.chwbl_load_factor * static_cast<double>(total + 1) / healthy);
    const std::uint64_t key = XXH3_64bits(ctx.affinity_key.data(), ctx.affinity_key.size());

    std::shared_ptr<const Ring> ring = ring_for(ctx);
    auto it = std::lower_bound(ring->nodes.begin(), ring->nodes.end(), std::make_pair(key, WorkerId{0}));
    std::optional<std::size_t> fallback;
    for (std::size_t step = 0; step < ring->nodes.size(); ++step, ++it) {
      if (it == ring->nodes.end()) it = ring->nodes.begin();
      const std::size_t i = ring->position.at(it->second);
      const WorkerView& w = ctx.workers[i];
      if (!w.healthy) continue;
      if (!fallback) fallback = i;
      if (w.in_flight + 1 <= bound) {
        return Pick{i, step == 0 ? Reason::kPrefixHit : Reason::kLoadFallback, ctx.matched_tokens(i), 0.0};
      }
    }
    return Pick{*fallback, Reason::kLoadFallback, ctx.matched_tokens(*fallback), 0.0};
  }

 private:
  struct Ring {
    std::vector<WorkerId> ids;                          // the worker set the ring was built for
    std::vector<std::pair<std::uint64_t, WorkerId>> nodes;  // sorted virtual nodes
    std::vector<std::size_t> position;                  // worker id -> index in RoutingContext::workers
  };

  // The ring depends only on the worker set, so it is built once per set and cached; pick() stays
  // observationally pure.
  std::shared_ptr<const Ring> ring_for(const RoutingContext& ctx) const {
    std::vector<WorkerId> ids;
    ids.reserve(ctx.workers.size());
    for (const auto& w : ctx.workers) ids.push_back(w.id);
    std::lock_guard lock(mu_);
    if (ring_ && ring_->ids == ids) return ring_;
    auto ring = std::make_shared<Ring>();
    ring->ids = ids;
    WorkerId max_id = 0;
    for (WorkerId id : ids) max_id = std::max(max_id, id);
    ring->position.assign(static_cast<std::size_t>(max_id) + 1, 0);
    for (std::size_t i = 0; i < ids.size(); ++i) {
      ring->position[ids[i]] = i;
      for (int r = 0; r < o_.chwbl_replicas; ++r) {
        const std::uint64_t vnode[2] = {ids[i], static_cast<std::uint64_t>(r)};
        ring->nodes.emplace_back(XXH3_64bits(vnode, sizeof vnode), ids[i]);
      }
    }
    std::sort(ring->nodes.begin(), ring->nodes.end());
    ring_ = ring;
    return ring;
  }

  PolicyOptions o_;
  mutable std::mutex mu_;
  mutable std::shared_ptr<const Ring> ring_;  // guarded by mu_
};

}  // namespace

std::unique_ptr<RoutingPolicy> make_chwbl(const PolicyOptions& options) { return std::make_unique<Chwbl>(options); }

}  // namespace kvroute::policy
