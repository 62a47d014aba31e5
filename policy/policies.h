// Constructors of every built-in policy (one file each; the algorithm each reimplements is cited at the top
// of its file). Use make_policy() from routing_policy.h to get one by name with session affinity applied.
#pragma once

#include <memory>

#include "policy/routing_policy.h"

namespace kvroute::policy {

std::unique_ptr<RoutingPolicy> make_round_robin();
std::unique_ptr<RoutingPolicy> make_random();
std::unique_ptr<RoutingPolicy> make_least_request();
std::unique_ptr<RoutingPolicy> make_power_of_two();
std::unique_ptr<RoutingPolicy> make_chwbl(const PolicyOptions& options);
std::unique_ptr<RoutingPolicy> make_cache_aware(const PolicyOptions& options);
std::unique_ptr<RoutingPolicy> make_block_cost(const PolicyOptions& options);
std::unique_ptr<RoutingPolicy> make_weighted_scorers(const PolicyOptions& options);
std::unique_ptr<RoutingPolicy> make_e2(const PolicyOptions& options);
std::unique_ptr<RoutingPolicy> make_kv_cost(const PolicyOptions& options);

// Decorator: prefers the session-bound worker (RoutingContext::preferred) unless the inner policy's estimate
// for it is worse than its best pick by more than options.session_margin_s (architecture section 6).
std::unique_ptr<RoutingPolicy> with_session_affinity(std::unique_ptr<RoutingPolicy> inner,
                                                     const PolicyOptions& options);

}  // namespace kvroute::policy
