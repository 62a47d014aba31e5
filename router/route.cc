// Router::route(): one routing decision, in the order a request meets it.
//
//   candidates()  the workers it may go to: healthy, not excluded (a retry's failed workers), serving its model,
//                 the owner alone for a continued response, no cordoned one, only those with room for a
//                 sheddable request; each view given the index's reuse counts and the learned rates
//   context()     what the policy reads: the chain and its match in the index, the session's bound worker
//   pick          policy_->pick(), pure
//   commit()      what the decision changes: the worker's pending prefill, the index (predicted or expected
//                 blocks), prefixes being computed (prefix holds), the session binding, the other replicas,
//                 the metrics and the pool-as-one-cache reference; and the same for a warm-up the pick names
//                 (commit_warm_up(): a prefix's copy made off the request's path, sent by router/warm_up.h)
//
// The rest of the Router (first byte, completion, sessions, response owners) is in router.cc.
#include "router/router.h"

#include <algorithm>
#include <cmath>

#include "backends/shared_state/wire.h"
#include "util/steady_seconds.h"

namespace kvroute::router {
namespace {

// splitmix64: a stateless mix of the request number into the policy's random draw (reproducible runs).
std::uint64_t mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A fleet may serve several models: workers that do not serve the request's model are taken out of its
// candidates, as long as a healthy worker serves it. When none does, every worker stays a candidate and the
// worker's own answer (an unknown model) reaches the client.
void keep_serving(const backends::WorkerList& workers, std::string_view model, std::vector<policy::WorkerView>& views) {
  thread_local std::vector<char> serving;
  serving.assign(views.size(), 0);
  bool any = false;
  for (std::size_t i = 0; i < views.size(); ++i) {
    serving[i] = workers[i]->serves(model);
    any = any || (serving[i] && views[i].healthy);
  }
  if (!any) return;
  for (std::size_t i = 0; i < views.size(); ++i) {
    if (!serving[i]) views[i].healthy = false;
  }
}

Error no_worker_error(const backends::WorkerList& workers) {
  const bool cordoned = std::any_of(workers.begin(), workers.end(), [](const auto& w) { return w->healthy() && w->cordoned(); });
  return make_error(workers.empty() ? "no workers are configured"
                    : cordoned      ? "no healthy worker is available to serve the request: the healthy ones are "
                                      "cordoned (POST /admin/workers/NAME/uncordon on the admin listener)"
                                    : "no healthy worker is available to serve the request",
                    503, "service_unavailable", "no_healthy_worker");
}
}  // namespace

Result<Decision> Router::route(const RoutableRequest& request, std::span<const hashing::WorkerId> exclude) {
  const auto t0 = std::chrono::steady_clock::now();
  if (background_count_.load(std::memory_order_relaxed) > 0) expire_background(t0);
  auto workers = registry_.snapshot();
  thread_local std::vector<policy::WorkerView> views;
  thread_local hashing::PrefixIndex::Match match;
  thread_local std::vector<std::uint64_t> capacity;
  std::optional<std::size_t> owner_at;
  if (auto ok = candidates(request, *workers, exclude, views, capacity, owner_at); !ok) return ok.error();

  policy::RoutingContext ctx;
  Session session;
  context(request, views, match, ctx, session);
  std::optional<policy::Pick> pick = policy_->pick(ctx);
  if (!pick) {
    metrics_.error("no_healthy_worker");
    return no_worker_error(*workers);
  }
  Decision d;
  d.worker = (*workers)[pick->worker];
  d.pick = *pick;
  if (!config_.warm_ups || request.endpoint == Endpoint::kResponses) {
    // No warm-up can copy the prompt (router/warm_up.h): no copy is made, and a session bound where the copy was to
    // go stays with its first turn. A Responses session always does: its next turn goes to the response's owner.
    if (request.endpoint == Endpoint::kResponses || d.pick.session_worker == d.pick.warm) d.pick.session_worker.reset();
    d.pick.warm.reset();
  }
  if (owner_at) d.pick.reason = policy::Reason::kPreviousResponse;
  if (!ctx.match) {
    // Prefix-blind policies still report what the index predicts, so hit-rate truth is comparable.
    match_prefix(request, match);
    ctx.match = &match;
    d.pick.predicted_cached_tokens = ctx.matched_tokens(pick->worker);
  }
  d.start = t0;
  commit(d, request, ctx, session);
  if (d.pick.warm && *d.pick.warm != d.pick.worker) {
    const bool binds = d.pick.session_worker == d.pick.warm;
    d.warm_up = commit_warm_up(request, ctx, *workers, *d.pick.warm, t0, binds ? session.hash : 0);
  }
  // A session bound where nothing of this request goes (policy::Pick::session_worker without a warm-up there): the
  // other replicas learn the binding from a record that carries nothing else.
  if (d.pick.session_worker && *d.pick.session_worker != d.pick.worker && d.pick.warm != d.pick.session_worker &&
      session.hash != 0) {
    if (auto* shared = shared_.load(std::memory_order_acquire))
      shared->routed((*workers)[*d.pick.session_worker]->endpoint().url, request.chain.root, {}, session.hash);
  }

  // What one cache holding the whole KV capacity of the chosen worker's pool (the workers that can hold the
  // same blocks) would have served; measured only while every routable worker of the pool has a known
  // capacity (reported, or --worker-kv-blocks), so the comparison is never against a cache smaller than the
  // pool's.
  if (auto shared = cache_pools_.access(*workers, pick->worker, capacity, request.chain.hashes)) {
    if (shared->resized) metrics_.set_shared_cache(cache_pools_.capacity_blocks(), cache_pools_.sample_rate());
    d.shared_cached_tokens = servable_tokens(request, shared->blocks);
    d.shared_pool = shared->pool;
    d.tokens_estimated = request.chain.unit != hashing::Unit::kToken;
  }
  return d;
}

Result<bool> Router::candidates(const RoutableRequest& request, const backends::WorkerList& workers,
                                std::span<const hashing::WorkerId> exclude, std::vector<policy::WorkerView>& views,
                                std::vector<std::uint64_t>& capacity, std::optional<std::size_t>& owner_at) {
  thread_local std::vector<std::uint64_t> reused;
  backends::WorkerRegistry::fill_views(workers, views);
  for (auto& v : views) v.healthy = v.healthy && std::find(exclude.begin(), exclude.end(), v.id) == exclude.end();
  if (shared_.load(std::memory_order_acquire)) add_remote_load(views);
  if (!request.model.empty()) keep_serving(workers, request.model, views);
  // A continued response goes to the worker that stores the one it continues, the only one that can serve it.
  // When that worker is gone or unhealthy the request is routed as any other, and the worker's answer (no
  // such response) reaches the client.
  if (!request.previous_response_id.empty()) {
    if (const auto owner = response_owner(request.previous_response_id)) {
      for (std::size_t i = 0; i < views.size(); ++i) {
        if (views[i].id == *owner && views[i].healthy) owner_at = i;
      }
      for (std::size_t i = 0; owner_at && i < views.size(); ++i) {
        if (i != *owner_at) views[i].healthy = false;
      }
    }
  }
  // A cordoned worker takes no new request, except the continuation of a response only it stores.
  if (!owner_at) {
    for (std::size_t i = 0; i < views.size(); ++i) {
      if (workers[i]->cordoned()) views[i].healthy = false;
    }
  }
  if (request.sheddable && !keep_with_room(views)) {
    metrics_.error("fleet_saturated");
    return make_error("every worker that could serve this request is saturated (" +
                          std::to_string(config_.shed_queue_depth) + " or more requests waiting, or " +
                          std::to_string(static_cast<int>(std::lround(config_.shed_kv_usage * 100))) +
                          " % or more of its KV cache in use), and the request is sheddable: try again shortly",
                      429, "resource_unavailable", "fleet_saturated");
  }
  hashing::WorkerId max_id = 0;
  for (const auto& v : views) max_id = std::max(max_id, v.id);
  reused.assign(static_cast<std::size_t>(max_id) + 1, 0);
  index_.worker_stats(reused, capacity);
  for (auto& v : views) {
    if (v.capacity_blocks == 0) v.capacity_blocks = capacity[v.id];
    v.reused_blocks = reused[v.id];  // kv_cost prices evicting blocks that get reused
    v.max_running = config_.worker_max_seqs;
    learner_.apply(v);
  }
  return true;
}

void Router::context(const RoutableRequest& request, std::vector<policy::WorkerView>& views,
                     hashing::PrefixIndex::Match& match, policy::RoutingContext& ctx, Session& session) {
  ctx.chain = &request.chain;
  ctx.tokens_per_block = request.chain.tokens_per_block();
  ctx.prompt_tokens = request.prompt_tokens;
  ctx.max_tokens = request.max_tokens;
  ctx.workers = views;
  ctx.affinity_key = request.affinity_key;
  ctx.sequence = sequence_.fetch_add(1, std::memory_order_relaxed);
  if (auto* shared = shared_.load(std::memory_order_acquire)) {
    const shared_state::SharedState::Turn turn = shared->turn();
    ctx.sequence = policy::replica_sequence(ctx.sequence, turn.rank, turn.replicas);
  }
  ctx.random = mix(ctx.sequence);
  ctx.session_context_tokens = session_context_.value();
  ctx.fleet_means = latencies_.means();
  if (policy_->uses_prefix_match()) {
    match_prefix(request, match);
    ctx.match = &match;
  }
  if (request.session_key.empty()) return;
  session.hash = session_hash(request.session_key);
  session.id = shared_state::wire::hex64(session.hash);
  // An unbound session is new (kv_cost opens it on a worker with the fewest sessions bound), unless Redis is
  // down: another replica may have bound it then, and the cached context decides as for any request.
  ctx.opens_session = true;
  if (auto bound = bound_worker(session.id)) {
    for (std::size_t i = 0; i < views.size(); ++i) {
      if (views[i].id == *bound) ctx.preferred = i;
    }
    ctx.opens_session = !ctx.preferred;
    if (ctx.preferred && ctx.match) session_context_.add(policy::own_context_tokens(ctx));
  } else if (auto* shared = shared_.load(std::memory_order_acquire)) {
    shared->lookup_session(session.hash);  // another replica may have bound it: known for the next turn
    ctx.opens_session = shared->up();
  }
  if (ctx.opens_session) count_sessions(views);  // ctx.workers views them
}

void Router::commit(Decision& d, const RoutableRequest& request, const policy::RoutingContext& ctx,
                    const Session& session) {
  const policy::WorkerView& chosen = ctx.workers[d.pick.worker];
  d.session_key = request.session_key;
  d.streamed = request.stream;
  d.background = request.background;
  d.queue_s = policy::queued_prefill_seconds(chosen);
  d.estimated_ttft_s = policy::uncorrected_ttft_estimate(d.pick, chosen);
  d.reported_ttft_s = policy::corrected_ttft_estimate(d.pick, chosen);
  d.decode_context_tokens = chosen.active_decode_tokens;
  // The session is bound where the pick says: kv_cost may bind an opening to another worker than its first turn's
  // (policy::Pick::session_worker), which a warm-up may copy the prompt to. The other replicas learn the binding
  // from the routed record of whichever goes there (route(): a record of the binding alone when nothing does).
  const std::size_t bound_at = d.pick.session_worker.value_or(d.pick.worker);
  if (!session.id.empty()) bind_session(session.id, ctx.workers[bound_at].id);
  // A session's later turns are never held (their prefix is their own context); its first turn is, as any request.
  begin_routed(d, request, ctx, bound_at == d.pick.worker ? session.hash : 0,
               /*may_hold=*/request.session_key.empty() || ctx.opens_session, request.max_tokens);
  metrics_.routed(std::string(policy::reason_name(d.pick.reason)));
  if (auto s = metrics_.worker(d.worker->id())) {
    s->requests->Increment();
    s->in_flight->Set(d.worker->in_flight());
    s->predicted_cached_tokens->Increment(static_cast<double>(d.pick.predicted_cached_tokens));
  }
  metrics_.decision_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - d.start).count());
}

std::shared_ptr<Decision> Router::commit_warm_up(const RoutableRequest& request, const policy::RoutingContext& ctx,
                                                 const backends::WorkerList& workers, std::size_t at,
                                                 std::chrono::steady_clock::time_point start, std::uint64_t session_hash) {
  auto d = std::make_shared<Decision>();
  d->worker = workers[at];
  d->pick.worker = at;
  d->pick.reason = policy::Reason::kPrefixHit;
  d->pick.predicted_cached_tokens = ctx.matched_tokens(at);
  d->start = start;
  // One output token: the prompt's prefill is the copy; what the worker answers is dropped.
  begin_routed(*d, request, ctx, session_hash, /*may_hold=*/false, /*max_tokens=*/1);
  return d;
}

void Router::begin_routed(Decision& d, const RoutableRequest& request, const policy::RoutingContext& ctx,
                          std::uint64_t session_hash, bool may_hold, std::uint32_t max_tokens) {
  const std::size_t at = d.pick.worker;
  d.prompt_tokens = request.prompt_tokens;
  d.uncached_tokens = request.prompt_tokens - std::min(request.prompt_tokens, d.pick.predicted_cached_tokens);
  // Observer: the worker will hold this prefix once it has prefilled it. In approximate mode that prediction
  // is all the router has (capacity-bounded LRU). In precise mode the worker's events are the truth, but they
  // come only after the prefill, so a burst on a new prefix would see it cold everywhere: the router adds the
  // routed chain's missing blocks as predicted at once (as Dynamo's KV router tracks in-flight blocks), the
  // events confirm them, and whatever is still unconfirmed when the request ends is dropped. Only token
  // chains can be confirmed (events carry token ids), so text chains are not recorded.
  d.kv_tokens = d.uncached_tokens + policy::expected_output_tokens(max_tokens);
  const double prefill_s = policy::prefill_seconds(static_cast<double>(d.uncached_tokens),
                                                   static_cast<double>(request.prompt_tokens - d.uncached_tokens),
                                                   ctx.workers[at].prefill_tokens_per_s);
  d.prefill_ticket = d.worker->begin(d.uncached_tokens, prefill_s, d.kv_tokens);
  const bool expected = d.worker->precise() && request.chain.unit == hashing::Unit::kToken;
  if (!d.worker->precise()) {
    index_.record(d.worker->id(), request.chain.hashes);
  } else if (expected) {
    if (config_.prefix_hold_s > 0 && policy_->waits_for_computing_prefix()) {
      // Its prefix's last block on this worker may be one an earlier request is still computing: hold it
      // until that lands (prefix_held()). Its own blocks beyond the match are computing until its first byte.
      // Only while that request may be admitted together with the earlier one (policy::prefix_hold_pays).
      const std::uint32_t m = ctx.matched_blocks(at);
      const auto id = d.worker->id();
      const double now = steady_seconds(d.start);
      const policy::WorkerView& view = ctx.workers[at];
      if (m > 0 && may_hold && computing_.holds_help(id)) {
        const auto leader = computing_.leader(id, m - 1, request.chain.hashes[m - 1]);
        if (leader && policy::prefix_hold_pays(view, static_cast<double>(ctx.matched_tokens(at)),
                                               static_cast<double>(m - leader->from) * ctx.tokens_per_block,
                                               now >= leader->starts_at)) {
          d.hold_leader = leader->token;
          d.hold_block = request.chain.hashes[m - 1];
          d.hold_until = d.start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                       std::chrono::duration<double>(config_.prefix_hold_s));
        }
      }
      // Its own prefill starts once the prefill queued ahead of it there is done, at the worker's rate.
      d.computing = computing_.begin(id, request.chain.hashes, m, now, now + policy::queued_prefill_seconds(view));
    }
    index_.expect(d.worker->id(), request.chain.hashes);
    d.expected = request.chain.hashes;
  }
  // The other replicas apply what this one predicted, the load it adds to the worker (until this replica's
  // next published load covers it) and the session it bound. In precise mode every replica reads the worker's
  // own events, but those come only after the prefill: the others expect the chain as this replica does, and
  // note the blocks it computes for their prefix holds (ReplicaSync::apply_routed).
  if (auto* shared = shared_.load(std::memory_order_acquire)) {
    const bool send_chain = !d.worker->precise() || expected;
    shared->routed(d.worker->endpoint().url, request.chain.root,
                   send_chain ? std::span(request.chain.hashes) : std::span<const hashing::BlockHash>(), session_hash,
                   policy::LoadShare{.in_flight = 1, .pending_prefill_tokens = d.uncached_tokens,
                                     .pending_prefill_s = prefill_s, .inflight_kv_tokens = d.kv_tokens},
                   expected ? ctx.matched_blocks(at) : 0);
  }
}

}  // namespace kvroute::router
