#include "policy/routing_policy.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "policy/policies.h"

namespace kvroute::policy {

double own_context_tokens(const RoutingContext& ctx) {
  if (!ctx.preferred) return 0.0;
  std::uint64_t shared = 0;
  for (std::size_t i = 0; i < ctx.workers.size(); ++i) {
    if (i != *ctx.preferred) shared = std::max(shared, ctx.matched_tokens(i));
  }
  const double context = static_cast<double>(ctx.prompt_tokens) + expected_output_tokens(ctx.max_tokens);
  return std::max(0.0, context - static_cast<double>(shared));
}

std::string_view reason_name(Reason r) {
  switch (r) {
    case Reason::kPrefixHit: return "prefix_hit";
    case Reason::kSession: return "session";
    case Reason::kLoadFallback: return "load_fallback";
    case Reason::kCold: return "cold";
    case Reason::kOnlyChoice: return "only_choice";
    case Reason::kPreviousResponse: return "previous_response";
  }
  return "unknown";
}

LoadShare queued_at(std::vector<TimedShare> parts, double now) {
  std::stable_sort(parts.begin(), parts.end(), [](const TimedShare& a, const TimedShare& b) { return a.at < b.at; });
  LoadShare sum;
  double t = parts.empty() ? now : parts.front().at;
  for (const TimedShare& p : parts) {
    sum.drain(p.at - t);
    t = std::max(t, p.at);
    sum.add(p.load);
  }
  sum.drain(now - t);
  return sum;
}

double RoutingPolicy::estimate(const RoutingContext&, std::size_t) const {
  return std::numeric_limits<double>::quiet_NaN();
}

double RoutingPolicy::itl_estimate(const RoutingContext&, std::size_t) const {
  return std::numeric_limits<double>::quiet_NaN();
}

double RoutingPolicy::expected_ttft(const RoutingContext&, std::size_t) const {
  return std::numeric_limits<double>::quiet_NaN();
}

namespace detail {

std::optional<std::size_t> least_loaded(const RoutingContext& ctx) {
  // Ties rotate with the request sequence so equal workers share the traffic instead of the first taking all.
  std::optional<std::size_t> best;
  const std::size_t n = ctx.workers.size();
  for (std::size_t k = 0; k < n; ++k) {
    const std::size_t i = (k + ctx.sequence) % n;
    if (!ctx.workers[i].healthy) continue;
    if (!best || ctx.workers[i].in_flight < ctx.workers[*best].in_flight) best = i;
  }
  return best;
}

std::size_t healthy_count(const RoutingContext& ctx) {
  return static_cast<std::size_t>(
      std::count_if(ctx.workers.begin(), ctx.workers.end(), [](const WorkerView& w) { return w.healthy; }));
}

}  // namespace detail

namespace {

struct Entry {
  const char* name;
  std::function<std::unique_ptr<RoutingPolicy>(const PolicyOptions&)> make;
};

const std::vector<Entry>& registry() {
  static const std::vector<Entry> entries = {
      {"round_robin", [](const PolicyOptions&) { return make_round_robin(); }},
      {"random", [](const PolicyOptions&) { return make_random(); }},
      {"least_request", [](const PolicyOptions&) { return make_least_request(); }},
      {"power_of_two", [](const PolicyOptions&) { return make_power_of_two(); }},
      {"chwbl", make_chwbl},
      {"cache_aware", make_cache_aware},
      {"block_cost", make_block_cost},
      {"weighted_scorers", make_weighted_scorers},
      {"e2", make_e2},
      {"kv_cost", make_kv_cost},
  };
  return entries;
}

}  // namespace

const std::vector<std::string>& policy_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& e : registry()) v.emplace_back(e.name);
    return v;
  }();
  return names;
}

Result<std::unique_ptr<RoutingPolicy>> make_policy(std::string_view name, const PolicyOptions& options) {
  for (const auto& e : registry()) {
    if (name == e.name) return with_session_affinity(e.make(options), options);
  }
  std::string valid;
  for (const auto& n : policy_names()) valid += (valid.empty() ? "" : ", ") + n;
  return make_error("unknown policy '" + std::string(name) + "' (valid: " + valid + ")");
}

}  // namespace kvroute::policy
