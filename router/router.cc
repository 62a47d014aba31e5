#include "router/router.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include <xxhash.h>

#include "backends/shared_state/wire.h"
#include "util/steady_seconds.h"

namespace kvroute::router {

Router::Router(const Config& config, backends::WorkerRegistry& registry,
               std::unique_ptr<policy::RoutingPolicy> policy, RouterMetrics& metrics)
    : config_(config),
      registry_(registry),
      policy_(std::move(policy)),
      metrics_(metrics),
      sessions_(config.max_sessions),
      response_owners_(config.response_ids) {
  // When workers' events store the blocks of requests in prefill, for the commit timing of prefix holds.
  index_.set_store_listener([this](hashing::WorkerId w, std::span<const hashing::BlockHash> blocks) {
    computing_.stored(w, blocks, steady_seconds(std::chrono::steady_clock::now()));
    hold_waiters_.stored(w, blocks);
  });
  registry_.subscribe({
      [this](const backends::Worker& w) {
        metrics_.add_worker(w.id(), w.name());
        index_.set_capacity(w.id(), config_.worker_kv_blocks);
        policy::WorkerRates prior;
        prior.prefill_tokens_per_s = config_.prefill_tokens_per_s;
        prior.decode_step_s = config_.decode_step_s;
        learner_.set_prior(w.id(), prior);
      },
      [this](const backends::Worker& w) {
        index_.clear_worker(w.id());
        learner_.forget(w.id());
        computing_.forget(w.id());
        metrics_.remove_worker(w.id());
        {
          std::lock_guard lock(sessions_mu_);
          sessions_.erase_if([&](const Binding& b) { return b.worker == w.id(); });
          bound_.erase(w.id());
        }
        std::lock_guard lock(responses_mu_);
        response_owners_.erase_if([&](hashing::WorkerId owner) { return owner == w.id(); });
      },
      {},
  });
}

bool Router::prefix_held(const Decision& d) const {
  if (d.hold_leader == 0 || std::chrono::steady_clock::now() >= d.hold_until) return false;
  const auto id = d.worker->id();
  if (!computing_.active(id, d.hold_leader)) return false;
  const auto tier = index_.tier(id, d.hold_block);
  return tier && *tier == hashing::Tier::kPredicted;  // stored on a real tier: the event confirmed it
}

std::string_view Router::prefix_commit(hashing::WorkerId id) const {
  switch (computing_.commit(id)) {
    case hashing::ComputingPrefixes::Commit::kAtSchedule: return "at_schedule";
    case hashing::ComputingPrefixes::Commit::kAfterStep: return "after_step";
    case hashing::ComputingPrefixes::Commit::kUnknown: break;
  }
  return "unknown";
}

HoldWaiters::Id Router::watch_prefix_hold(const Decision& d, std::function<void()> wake) {
  if (d.hold_leader == 0) return 0;
  return hold_waiters_.add(d.worker->id(), d.hold_leader, d.hold_block, std::move(wake));
}

void Router::computing_done(Decision& d, bool first_token) {
  const auto token = std::exchange(d.computing, 0);
  if (token == 0) return;
  const auto id = d.worker->id();
  if (first_token) {
    const auto unstored = computing_.first_token(id, token, steady_seconds(d.first_byte_at));
    // Replicas holding requests for this prefix hear of it now, not only when the worker's event stores it.
    auto* shared = shared_.load(std::memory_order_acquire);
    if (unstored && shared && shared->up()) shared->prefix_computed(d.worker->endpoint().url, *unstored);
  } else {
    computing_.end(id, token);
  }
  hold_waiters_.leader_done(id, token);  // the requests held for its prefix check again
}

void Router::prefix_hold_ended(Decision& d) {
  if (d.hold_leader == 0) return;
  d.hold_leader = 0;
  metrics_.prefix_held(std::chrono::duration<double>(std::chrono::steady_clock::now() - d.start).count());
}

bool Router::keep_with_room(std::vector<policy::WorkerView>& views) const {
  // Room: a short waiting queue and KV cache to spare as last polled, and, between polls, no more requests
  // sent than it can run plus that queue.
  auto room = [&](const policy::WorkerView& v) {
    return v.waiting < config_.shed_queue_depth && v.kv_usage < config_.shed_kv_usage &&
           v.in_flight < config_.worker_max_seqs + config_.shed_queue_depth;
  };
  bool any_healthy = false, any_room = false;
  for (const auto& v : views) {
    any_healthy = any_healthy || v.healthy;
    any_room = any_room || (v.healthy && room(v));
  }
  // No healthy worker at all is not saturation: the request fails as unroutable (503).
  if (!any_healthy) return true;
  if (!any_room) return false;
  for (auto& v : views) v.healthy = v.healthy && room(v);
  return true;
}

std::uint64_t Router::servable_tokens(const RoutableRequest& request, std::uint64_t blocks) {
  return policy::tokens_of_blocks(std::min<std::uint64_t>(blocks, servable_blocks(request)),
                                  request.chain.tokens_per_block(), request.prompt_tokens);
}

std::uint32_t Router::servable_blocks(const RoutableRequest& request) {
  if (request.chain.unit != hashing::Unit::kToken || request.chain.total_units == 0) return UINT32_MAX;
  // An engine always computes the prompt's last token to get its logits, so a fully cached prompt still
  // recomputes its last block: vLLM caps a hit at prompt_len - 1 tokens (vllm/v1/core/kv_cache_manager.py,
  // get_computed_blocks). Predictions follow the same rule so they match what the worker reports.
  return static_cast<std::uint32_t>((request.chain.total_units - 1) / request.chain.block_units);
}

void Router::match_prefix(const RoutableRequest& request, hashing::PrefixIndex::Match& out) const {
  index_.match(request.chain.hashes, out);
  const std::uint32_t cap = servable_blocks(request);
  if (cap == UINT32_MAX) return;
  for (auto& b : out.blocks) b = std::min(b, cap);
  for (auto& b : out.cpu_blocks) b = std::min(b, cap);
  out.longest = std::min(out.longest, cap);
}

void Router::remember_response(std::string id, hashing::WorkerId worker) {
  if (auto* shared = shared_.load(std::memory_order_acquire)) {
    if (auto w = registry_.find(worker)) shared->response_owner(id, w->endpoint().url);
  }
  adopt_response(id, worker);
}

void Router::adopt_response(const std::string& id, hashing::WorkerId worker) {
  std::lock_guard lock(responses_mu_);
  response_owners_.put(id, worker);
}

std::optional<hashing::WorkerId> Router::response_owner(const std::string& id) const {
  {
    std::lock_guard lock(responses_mu_);
    if (const hashing::WorkerId* owner = response_owners_.find(id)) return *owner;
  }
  if (auto* shared = shared_.load(std::memory_order_acquire)) shared->lookup_response(id);  // the answer comes later, through adopt_response()
  return std::nullopt;
}

std::uint64_t Router::session_hash(std::string_view key) {
  // A fixed seed: every replica must map a key to the same hash (docs/operations.md, "Router replicas").
  return XXH3_64bits_withSeed(key.data(), key.size(), 0x6b76726f75746573ull);
}

void Router::expect_elsewhere(hashing::WorkerId worker, std::span<const hashing::BlockHash> chain,
                              std::size_t computes_from) {
  index_.expect(worker, chain);
  if (config_.prefix_hold_s > 0 && policy_->waits_for_computing_prefix()) {
    computing_.begin_elsewhere(worker, chain, computes_from, steady_seconds(std::chrono::steady_clock::now()));
  }
}

void Router::computed_elsewhere(hashing::WorkerId worker, hashing::BlockHash last) {
  for (const auto token : computing_.computed_elsewhere(worker, last)) hold_waiters_.leader_done(worker, token);
}

void Router::adopt_session(std::uint64_t key_hash, hashing::WorkerId worker) {
  bind_session(shared_state::wire::hex64(key_hash), worker);
}

void Router::set_remote_load(std::vector<RemoteLoad> by_worker, double as_of_s) {
  auto next = by_worker.empty() ? nullptr : std::make_shared<const std::vector<RemoteLoad>>(std::move(by_worker));
  std::lock_guard lock(remote_mu_);
  remote_load_ = std::move(next);
  remote_as_of_s_ = as_of_s;
}

double Router::stagger_s(const RoutableRequest& request) {
  if (!config_.shared_state_stagger) return 0.0;
  auto* shared = shared_.load(std::memory_order_acquire);
  if (!shared || !shared->up()) return 0.0;
  const shared_state::SharedState::Turn turn = shared->turn();
  // A stream slower than the load's interval (Redis slow or far): the published load tells the others about as
  // soon, and waiting would pass Redis's slowness on to clients.
  if (turn.stream_delay_s > config_.shared_state_interval_s) return 0.0;
  const double prefill_s = learner_.typical_prefill_s(static_cast<double>(request.prompt_tokens));
  const double now_s = steady_seconds(std::chrono::steady_clock::now());
  double wait = 0;
  {
    std::lock_guard lock(stagger_mu_);
    wait = stagger_.arrive(now_s, turn.rank, turn.replicas, turn.stream_delay_s, prefill_s);
  }
  if (wait > 0) metrics_.staggered(wait);
  return wait;
}

void Router::add_remote_load(std::vector<policy::WorkerView>& views) const {
  std::shared_ptr<const std::vector<RemoteLoad>> remote;
  double as_of_s = 0;
  {
    std::lock_guard lock(remote_mu_);
    remote = remote_load_;
    as_of_s = remote_as_of_s_;
  }
  if (!remote) return;
  const double age_s = as_of_s > 0 ? steady_seconds(std::chrono::steady_clock::now()) - as_of_s : 0;
  // Every replica's requests load the same workers: a worker is priced by the sum (architecture section 11).
  for (auto& v : views) {
    if (v.id >= remote->size()) continue;
    RemoteLoad l = (*remote)[v.id];
    l.drain(age_s);
    l.add_to(v);
  }
}

std::shared_ptr<backends::Worker> Router::any_healthy(std::string_view model) const {
  std::shared_ptr<backends::Worker> best, best_serving;
  const auto workers = registry_.snapshot();
  for (const auto& w : *workers) {
    if (!w->routable()) continue;
    if (!best || w->in_flight() < best->in_flight()) best = w;
    if (!model.empty() && w->serves(model) && (!best_serving || w->in_flight() < best_serving->in_flight())) {
      best_serving = w;
    }
  }
  return best_serving ? best_serving : best;
}

void Router::first_byte(Decision& d) {
  if (d.first_byte_seen) return;
  d.first_byte_seen = true;
  d.first_byte_at = std::chrono::steady_clock::now();
  d.ttft_s = std::chrono::duration<double>(d.first_byte_at - d.start).count();
  d.worker->first_token(d.prefill_ticket, d.uncached_tokens, d.prompt_tokens);
  // A streamed request's first byte is its first token: when the worker's event stored the last block it
  // computed, against now, tells when the worker makes blocks hits (hashing/computing_prefixes.h).
  computing_done(d, d.streamed);
  if (d.worker->removed() || d.background) return;  // removed: its id may be another worker's (complete())
  if (d.streamed) latencies_.first_token(d.ttft_s);  // only a streamed response's first byte is its first token
  metrics_.ttft(d.worker->id(), d.ttft_s, d.status);  // an error body's first byte is no token
}

void Router::inter_token(const Decision& d, double seconds) {
  if (!d.worker->removed()) metrics_.itl(d.worker->id(), seconds);
}

void Router::worker_done(Decision& d) {
  if (!d.held && !d.background && !d.load_ended) end_load(d);
}

void Router::end_load(Decision& d) {
  d.load_ended = true;
  d.worker->end(d.prefill_ticket, d.first_byte_seen, d.uncached_tokens, d.prompt_tokens, d.kv_tokens);
}

void Router::warm_up_done(Decision& d, bool answered) {
  if (d.load_ended) return;
  if (answered) {
    // Not streamed: the answer is whole, its prefill long done. What the worker's queue says of its first token.
    d.first_byte_seen = true;
    d.worker->first_token(d.prefill_ticket, d.uncached_tokens, d.prompt_tokens);
  }
  computing_done(d, /*first_token=*/false);
  end_load(d);
  metrics_.warm_up(answered);
  if (!d.worker->removed() && !d.expected.empty()) index_.drop_unconfirmed(d.worker->id(), d.expected);
}

void Router::complete(Decision& d, const Outcome& outcome) {
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - d.start).count();
  computing_done(d, /*first_token=*/false);
  // A queued background response keeps its load on the worker until it ends (holds_background()). Streamed, its
  // exchange lasted until the response was done. One held when its answer was read (hold_answered) stays held
  // whether that answer then reached the client or not: the response runs on the worker either way.
  if (!d.held && !d.load_ended) {
    if (d.background && !d.streamed && outcome.ok && !d.response_id.empty() && !d.worker->removed()) {
      hold_background(d);
    } else {
      end_load(d);
    }
  }
  metrics_.request_seconds(total);
  if (!outcome.ok && outcome.worker_failed) metrics_.error("upstream");
  // A worker removed while the request ran: its id (the key of the index, the learned rates and the
  // per-worker metrics) may belong to another worker by now.
  if (d.worker->removed()) return;
  if (!d.expected.empty()) index_.drop_unconfirmed(d.worker->id(), d.expected);
  if (outcome.ok && outcome.usage && d.streamed && d.first_byte_seen) {
    // A streamed response's first byte is its first token: TTFT against uncached tokens teaches the prefill
    // rate, the spacing of the rest the decode step (policy/rate_learner.h).
    const auto& u = *outcome.usage;
    policy::RateObservation obs;
    obs.ttft_s = d.ttft_s;
    obs.queue_s = d.queue_s;
    obs.cached_tokens = std::min(u.prompt_tokens, u.cached_tokens);
    obs.uncached_tokens = u.prompt_tokens - obs.cached_tokens;
    obs.output_tokens = static_cast<std::uint32_t>(u.completion_tokens);
    if (u.completion_tokens >= 2) {
      obs.itl_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - d.first_byte_at).count() /
                  static_cast<double>(u.completion_tokens - 1);
    }
    obs.decode_context_tokens = d.decode_context_tokens;
    obs.estimated_ttft_s = d.estimated_ttft_s;
    obs.estimated_itl_s = d.pick.itl_estimate_s;
    learner_.observe(d.worker->id(), obs);
    latencies_.completed(obs.itl_s, total);
    metrics_.estimate_ratio(obs.ttft_s, d.reported_ttft_s, obs.itl_s, obs.estimated_itl_s);
  }
  if (auto s = metrics_.worker(d.worker->id())) {
    s->in_flight->Set(d.worker->in_flight());
    if (outcome.usage) {
      const auto& u = *outcome.usage;
      s->prompt_tokens->Increment(static_cast<double>(u.prompt_tokens));
      s->reported_cached_tokens->Increment(static_cast<double>(u.cached_tokens));
      s->confirmed_cached_tokens->Increment(static_cast<double>(std::min(u.cached_tokens, d.pick.predicted_cached_tokens)));
      s->completion_tokens->Increment(static_cast<double>(u.completion_tokens));
      if (d.shared_cached_tokens) {
        // A text prompt's blocks stand for the router's estimate of its tokens; the worker has now said how many
        // there were, so the shared cache's figure is scaled to the same count as the worker's.
        std::uint64_t shared = *d.shared_cached_tokens;
        if (d.tokens_estimated && d.prompt_tokens > 0 && u.prompt_tokens > 0) {
          shared = std::min<std::uint64_t>(u.prompt_tokens - 1,
                                           static_cast<std::uint64_t>(std::llround(static_cast<double>(shared) *
                                                                                   static_cast<double>(u.prompt_tokens) /
                                                                                   static_cast<double>(d.prompt_tokens))));
        }
        metrics_.fleet_cache_hits(u.cached_tokens, shared);
        cache_pools_.count(d.shared_pool, u.cached_tokens, shared);
      }
    }
  }
  metrics_.set_index(index_.entries(), index_.memory_bytes());
  metrics_.set_sessions(session_count());
}

void Router::hold_background(const Decision& d) {
  HeldBackground h{d.worker, d.first_byte_seen, d.uncached_tokens, d.prompt_tokens, d.prefill_ticket,
                   std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                         std::chrono::duration<double>(config_.request_timeout_s)),
                   d.kv_tokens};
  std::optional<HeldBackground> replaced;
  std::size_t held = 0;
  {
    std::lock_guard lock(background_mu_);
    replaced = background_.take(d.response_id);  // the same id again (a worker reusing ids): the older one is over
    background_.put(d.response_id, std::move(h));
    held = background_.size();
    background_count_.store(held, std::memory_order_relaxed);
  }
  if (replaced) release(*replaced);
  metrics_.set_background_held(held);
  if (held > kMaxHeldBackground) expire_background(std::chrono::steady_clock::now());
}

void Router::hold_answered(Decision& d) {
  if (d.held || !d.background || d.streamed || d.response_id.empty() || d.worker->removed()) return;
  hold_background(d);
  d.held = true;
}

bool Router::holds_background(const std::string& id) const {
  if (background_count_.load(std::memory_order_relaxed) == 0) return false;
  std::lock_guard lock(background_mu_);
  return background_.find(id) != nullptr;
}

void Router::background_ended(const std::string& id) {
  std::optional<HeldBackground> ended;
  std::size_t held = 0;
  {
    std::lock_guard lock(background_mu_);
    ended = background_.take(id);
    if (!ended) return;
    held = background_.size();
    background_count_.store(held, std::memory_order_relaxed);
  }
  release(*ended);
  metrics_.set_background_held(held);
}

std::size_t Router::background_held() {
  expire_background(std::chrono::steady_clock::now());
  const std::size_t held = background_count_.load(std::memory_order_relaxed);
  metrics_.set_background_held(held);
  return held;
}

void Router::expire_background(std::chrono::steady_clock::time_point now) {
  std::vector<HeldBackground> expired;
  std::size_t held = 0;
  {
    std::lock_guard lock(background_mu_);
    background_.drop_oldest_while(
        [&](const HeldBackground& h) { return h.deadline <= now || background_.size() > kMaxHeldBackground; },
        [&](HeldBackground&& h) { expired.push_back(std::move(h)); });
    held = background_.size();
    background_count_.store(held, std::memory_order_relaxed);
  }
  if (expired.empty()) return;
  for (const auto& h : expired) release(h);
  metrics_.set_background_held(held);
}

void Router::release(const HeldBackground& h) {
  h.worker->end(h.prefill_ticket, h.first_token, h.uncached, h.context, h.kv_tokens);
  if (h.worker->removed()) return;
  if (auto s = metrics_.worker(h.worker->id())) s->in_flight->Set(h.worker->in_flight());
}

void Router::bind_session(const std::string& hashed_key, hashing::WorkerId worker) {
  const auto now = std::chrono::steady_clock::now();
  std::size_t evicted = 0;
  {
    std::lock_guard lock(sessions_mu_);
    // Expired bindings go first: one idle past the TTL that is bound again is an opening, as a new one is.
    expire_sessions(now);
    const Binding* was = sessions_.find(hashed_key);
    if (!was || was->worker != worker) {
      if (was) --bound_[was->worker].count;
      ++bound_[worker].count;
    }
    if (!was) bound_[worker].last_opened = now;
    // At --max-sessions, the least recently used binding makes room.
    evicted = sessions_.put(hashed_key, Binding{worker, now}, [&](Binding&& b) { uncount(b); });
  }
  if (evicted > 0) metrics_.sessions_evicted(evicted);
}

void Router::expire_sessions(std::chrono::steady_clock::time_point now) {
  const auto ttl = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(config_.session_ttl_s));
  // Bindings are ordered by last use, so the expired ones are all at the old end.
  sessions_.drop_oldest_while([&](const Binding& b) { return now - b.last_used > ttl; },
                              [&](Binding&& b) { uncount(b); });
}

std::uint32_t Router::counted_sessions(hashing::WorkerId id) const {
  const auto it = bound_.find(id);
  return it == bound_.end() ? 0 : it->second.count;
}

void Router::count_sessions(std::vector<policy::WorkerView>& views) {
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard lock(sessions_mu_);
  expire_sessions(now);
  for (auto& v : views) {
    const auto it = bound_.find(v.id);
    v.sessions = it == bound_.end() ? 0 : it->second.count;
    if (it != bound_.end() && it->second.last_opened)
      v.session_opened_ago_s = std::chrono::duration<double>(now - *it->second.last_opened).count();
  }
}

std::optional<hashing::WorkerId> Router::session_worker(const std::string& key) const {
  return bound_worker(shared_state::wire::hex64(session_hash(key)));
}

std::optional<hashing::WorkerId> Router::bound_worker(const std::string& hashed_key) const {
  const auto now = std::chrono::steady_clock::now();
  const auto ttl = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(config_.session_ttl_s));
  std::lock_guard lock(sessions_mu_);
  const Binding* b = sessions_.find(hashed_key);
  if (!b || now - b->last_used > ttl) return std::nullopt;
  return b->worker;
}

std::uint32_t Router::sessions_bound(hashing::WorkerId id) {
  std::lock_guard lock(sessions_mu_);
  expire_sessions(std::chrono::steady_clock::now());
  return counted_sessions(id);
}

void Router::publish_sessions() {
  // The counts under the lock, the gauges after it: no other lock is taken while sessions_mu_ is held.
  const auto workers = registry_.snapshot();
  std::vector<std::uint32_t> counts;
  counts.reserve(workers->size());
  std::size_t total = 0;
  {
    std::lock_guard lock(sessions_mu_);
    expire_sessions(std::chrono::steady_clock::now());
    total = sessions_.size();
    for (const auto& w : *workers) counts.push_back(counted_sessions(w->id()));
  }
  metrics_.set_sessions(total);
  metrics_.set_session_own_context(session_context_.value());
  const policy::RoutingContext::FleetMeans means = latencies_.means();
  metrics_.set_fleet_means(means.ttft_s, means.itl_s, means.e2e_s);
  for (std::size_t i = 0; i < workers->size(); ++i) {
    if (auto s = metrics_.worker((*workers)[i]->id())) s->sessions->Set(counts[i]);
  }
}

std::size_t Router::session_count() const {
  std::lock_guard lock(sessions_mu_);
  return sessions_.size();
}

}  // namespace kvroute::router
