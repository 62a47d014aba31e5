// Router: the decision pipeline of one request (architecture section 2): match, pick, and the observer that
// updates load, the prefix index, session bindings and metrics when requests start and finish.
//
// route() never blocks on I/O. The policy's pick() is pure; only this class writes the index and counters.
//
//   auto d = router.route(parsed_request);        // Result<Decision>; 503 when no worker is healthy
//   ... forward to d->worker ...
//   router.first_byte(*d, ttft_s);
//   router.complete(*d, outcome);
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>

#include "backends/shared_state/shared_state.h"
#include "backends/worker_registry.h"
#include "hashing/computing_prefixes.h"
#include "hashing/prefix_index.h"
#include "policy/burst_stagger.h"
#include "policy/rate_learner.h"
#include "policy/recent_quantile.h"
#include "policy/routing_policy.h"
#include "router/cache_pools.h"
#include "router/config.h"
#include "router/hold_waiters.h"
#include "router/metrics.h"
#include "router/request.h"
#include "util/recency_map.h"

namespace kvroute::router {

struct Decision {
  std::shared_ptr<backends::Worker> worker;
  policy::Pick pick;
  std::uint64_t prompt_tokens = 0;
  std::uint64_t uncached_tokens = 0;
  std::string session_key;
  std::chrono::steady_clock::time_point start;
  bool first_byte_seen = false;
  double ttft_s = 0;
  std::chrono::steady_clock::time_point first_byte_at;
  bool streamed = false;           // the first byte is the first token (server-sent events)
  unsigned status = 0;             // the worker's HTTP status, once its head came (TTFT counts only 2xx)
  // A Responses API request run in the background: its answer ("queued") comes before any token, so it has no
  // TTFT and no usage; unless streamed, its load stays held after that answer (Router::holds_background).
  bool background = false;
  double queue_s = 0;              // prefill work the router believed queued ahead at dispatch (seconds)
  double estimated_ttft_s = 0;     // the same before the learned correction (what the learner checks)
  double reported_ttft_s = 0;      // the TTFT estimate as reported (policy::corrected_ttft_estimate)
  std::uint64_t prefill_ticket = 0;  // its place in the worker's prefill queue (backends::Worker::begin)
  std::uint64_t decode_context_tokens = 0;  // the worker's active decode tokens at dispatch
  std::uint64_t kv_tokens = 0;     // KV it will have allocated at its end (backends::Worker::begin)
  std::vector<hashing::BlockHash> expected;  // precise mode: blocks predicted at dispatch, settled at the end
  // Prompt tokens one LRU holding the whole KV capacity of the worker's pool would have served
  // (router/cache_pools.h); unset while a healthy worker of the pool has an unknown capacity. In the router's
  // estimate of the prompt's tokens when `tokens_estimated` (a text prompt hashed without the worker's
  // tokenizer).
  std::optional<std::uint64_t> shared_cached_tokens;
  std::uint64_t shared_pool = 0;  // that pool's name
  bool tokens_estimated = false;
  std::string response_id;  // a background request's response id, from its "queued" answer
  bool held = false;        // its load is already held as a background response's (Router::hold_answered)
  bool load_ended = false;  // its load on the worker has ended (Router::worker_done)
  // kv_cost's prefix hold (Router::prefix_held): the blocks this request computes on its worker until its
  // first byte, and, when it is held, the earlier request computing its prefix's last block.
  hashing::ComputingPrefixes::Token computing = 0;
  hashing::ComputingPrefixes::Token hold_leader = 0;  // 0: not held
  hashing::BlockHash hold_block = 0;
  std::chrono::steady_clock::time_point hold_until;
  // A copy of the request's prefix bought off its path (policy::Pick::warm): the second worker's own decision,
  // committed with this one; the caller sends it (router/warm_up.h) and ends it with Router::warm_up_done().
  std::shared_ptr<Decision> warm_up;
};

struct Usage {
  std::uint64_t prompt_tokens = 0;
  std::uint64_t completion_tokens = 0;
  std::uint64_t cached_tokens = 0;
};

struct Outcome {
  bool ok = false;                // upstream answered with 2xx and the exchange completed
  std::optional<Usage> usage;     // when the response carried usage
  // A failure counted in kvroute_errors_total{kind="upstream"}; not when the client left (counted as
  // client_disconnected) or the request is being routed to another worker.
  bool worker_failed = true;
};

class Router {
 public:
  Router(const Config& config, backends::WorkerRegistry& registry, std::unique_ptr<policy::RoutingPolicy> policy,
         RouterMetrics& metrics);

  // `exclude`: workers the request must not go to (those that already failed it: a retry goes elsewhere).
  Result<Decision> route(const RoutableRequest& request, std::span<const hashing::WorkerId> exclude = {});
  // The least loaded healthy worker (pass-through routes); with a model, one that serves it if any healthy
  // worker does.
  std::shared_ptr<backends::Worker> any_healthy(std::string_view model = {}) const;
  void first_byte(Decision& d);
  // Inter-token latency of a streamed response (kvroute_itl_seconds), skipped for a worker removed meanwhile.
  void inter_token(const Decision& d, double seconds);
  // The worker has sent the whole response, which is about to reach the client: the request's load on the
  // worker ends now (complete() comes only after the last write, and a client that sends its next request as
  // soon as it has read this one must find the worker free, or a conversation's next turn is priced against
  // its own last one). No-op for a background request, whose load complete() or hold_answered() settles.
  void worker_done(Decision& d);
  void complete(Decision& d, const Outcome& outcome);
  // A warm-up (Decision::warm_up) ended: its load on the worker ends, and its predicted blocks the worker has not
  // confirmed go. `answered`: the worker answered it (the prompt is in its cache).
  void warm_up_done(Decision& d, bool answered);
  // kv_cost's prefix hold. A request route() sent to a worker in precise mode, with no session, whose matched
  // prefix there ends in a block that an earlier request is still computing (hashing/computing_prefixes.h)
  // has d.hold_leader set: the caller sends it only once prefix_held() turns false, which is when that
  // request's first byte came or it ended, the worker's KV event stored the block, --prefix-hold passed, or
  // the block left the index; then calls prefix_hold_ended(). An engine that makes blocks hits only after the
  // step computing them (SGLang) would otherwise compute the prefix again for a request admitted meanwhile;
  // one that makes them hits when scheduled (vLLM v1) stores them, and says so, at once, and once a worker
  // has shown that (prefix_commit()), nothing is held there.
  bool prefix_held(const Decision& d) const;
  void prefix_hold_ended(Decision& d);
  // Calls `wake` once, from whichever thread notices it, when the hold of `d` may have ended (the request
  // computing its prefix had its first byte or ended, or the worker's event stored the held block); the caller
  // then checks prefix_held() again. The cap (--prefix-hold) and a block leaving the index wake nothing: the
  // caller checks on its own at least that often (router/hold_waiters.h).
  HoldWaiters::Id watch_prefix_hold(const Decision& d, std::function<void()> wake);
  void unwatch_prefix_hold(HoldWaiters::Id id) { hold_waiters_.remove(id); }
  // When the worker makes computed blocks cache hits, as learned from its streamed first tokens and KV events
  // (hashing/computing_prefixes.h): "at_schedule" (no holds there), "after_step", or "unknown" yet.
  std::string_view prefix_commit(hashing::WorkerId id) const;

  hashing::PrefixIndex& index() { return index_; }
  // One cache of each pool's whole KV capacity, the reference of kvroute_fleet_cache_hit_tokens_total.
  const CachePools& cache_pools() const { return cache_pools_; }
  // Rates learned online per worker (architecture section 7), for the admin API.
  policy::WorkerRates learned_rates(hashing::WorkerId id) const { return learner_.rates(id); }
  const policy::RoutingPolicy& policy() const { return *policy_; }
  std::size_t session_count() const;
  // The live session bindings on worker `id` (admin; kv_cost reads them as WorkerView::sessions).
  std::uint32_t sessions_bound(hashing::WorkerId id);
  // Sets kvroute_sessions and each worker's kvroute_worker_sessions, expired bindings dropped first (a scrape).
  void publish_sessions();
  // Responses API: the worker that made (and stores) response `id`. A request that names it as its
  // previous_response_id goes to that worker while it is healthy: no other worker can continue it. The
  // --response-ids most recently seen ids are kept.
  void remember_response(std::string id, hashing::WorkerId worker);
  std::optional<hashing::WorkerId> response_owner(const std::string& id) const;
  // The worker a session is bound to, if any (admin and tests).
  std::optional<hashing::WorkerId> session_worker(const std::string& key) const;

  // Router replicas (architecture section 11, router/replica_sync.h). With a shared state set, route() sends
  // what it routed and bound there, remember_response() the owner, and misses of sessions and response ids are
  // asked for there; none of it waits. The apply side comes from the shared state's thread: the other
  // replicas' bindings, owners and learned rates, and their load, which route() adds to each worker's own.
  void set_shared_state(shared_state::SharedState* state) { shared_.store(state, std::memory_order_release); }
  // How long to wait before routing a request that just arrived (0 most of the time): with replicas sharing
  // state, requests that reach several of them at once take turns (policy/burst_stagger.h, --shared-state-stagger);
  // the caller routes it after that wait. Counts the requests that wait (kvroute_staggered_requests_total).
  double stagger_s(const RoutableRequest& request);
  // The shared state's status (admin API); nullopt for a replica alone.
  std::optional<shared_state::SharedState::Status> shared_state_status() const {
    auto* s = shared_.load(std::memory_order_acquire);
    if (!s) return std::nullopt;
    return s->status();
  }
  // Sessions are kept by this hash of their key (the replicas share only the hash).
  static std::uint64_t session_hash(std::string_view key);
  void adopt_session(std::uint64_t key_hash, hashing::WorkerId worker);
  // Another replica routed this token chain to a precise-mode worker: expected here too (predicted until the
  // worker's events store it), and its blocks from `computes_from` on computing there, for prefix holds.
  void expect_elsewhere(hashing::WorkerId worker, std::span<const hashing::BlockHash> chain, std::size_t computes_from);
  // Another replica's request computing up to `last` on the worker had its first token (SharedState::
  // prefix_computed): the requests held here for its prefix check again.
  void computed_elsewhere(hashing::WorkerId worker, hashing::BlockHash last);
  void adopt_response(const std::string& id, hashing::WorkerId worker);
  void seed_rates(hashing::WorkerId worker, const policy::WorkerRates& rates) { learner_.seed(worker, rates); }
  // The other replicas' load, indexed by worker id (replaces the previous one; empty: none known), as of
  // `as_of_s` (seconds on the steady clock): route() drains its pending prefill by the time since
  // (policy::LoadShare::drain).
  using RemoteLoad = policy::LoadShare;
  void set_remote_load(std::vector<RemoteLoad> by_worker, double as_of_s = 0);

  // Background responses ("background": true, not streamed) are answered "queued" at once and run on their
  // worker afterwards. complete() keeps such a request's load (in flight, its context in decode) on the worker
  // until this router sees it end: a poll through it answered with a final status, a cancel or delete passed through it, or
  // --request-timeout after the answer (another router replica's polls are not seen). At most 100,000 are held;
  // beyond, the oldest is let go.
  bool holds_background(const std::string& id) const;
  // The background request's "queued" answer has been read in full, and is about to reach the client: its
  // load is held from now on. Called before the answer is written, so that a client that polls or cancels the
  // moment it has the id finds it held; complete() comes only after the write. No-op for other requests.
  void hold_answered(Decision& d);
  void background_ended(const std::string& id);
  // How many are held, after letting go of those past their deadline (sets the metric; read at /metrics).
  std::size_t background_held();

 private:
  // The request's blocks are no longer being computed: at its first token (which teaches the worker's commit
  // timing) or at its end; wakes the requests held for them. No-op once done.
  void computing_done(Decision& d, bool first_token);
  struct Binding {
    hashing::WorkerId worker;
    std::chrono::steady_clock::time_point last_used;
  };
  // route()'s phases (router/route.cc): the candidate workers and their views, what the policy reads, and
  // what the decision changes.
  struct Session {
    std::uint64_t hash = 0;  // session_hash() of the key; 0 without a session
    std::string id;          // the hash in hex, the key of the bindings
  };
  Result<bool> candidates(const RoutableRequest& request, const backends::WorkerList& workers,
                          std::span<const hashing::WorkerId> exclude, std::vector<policy::WorkerView>& views,
                          std::vector<std::uint64_t>& capacity, std::optional<std::size_t>& owner_at);
  void context(const RoutableRequest& request, std::vector<policy::WorkerView>& views,
               hashing::PrefixIndex::Match& match, policy::RoutingContext& ctx, Session& session);
  void commit(Decision& d, const RoutableRequest& request, const policy::RoutingContext& ctx, const Session& session);
  // The warm-up of a pick that names one (policy::Pick::warm, when warm-ups are on and the request is not a
  // Responses API one, whose body would store a response): committed as a request to that worker would be, without
  // a prefix hold or the request metrics. `session_hash`: the session bound there (the others hear of it), 0: none.
  std::shared_ptr<Decision> commit_warm_up(const RoutableRequest& request, const policy::RoutingContext& ctx,
                                           const backends::WorkerList& workers, std::size_t at,
                                           std::chrono::steady_clock::time_point start, std::uint64_t session_hash);
  // commit()'s observer part, shared with warm-ups: the load begins on the worker, the index predicts or expects
  // the chain there, its blocks are computing (prefix holds, when `may_hold` lets this request be held), and the
  // other replicas hear of it.
  void begin_routed(Decision& d, const RoutableRequest& request, const policy::RoutingContext& ctx,
                    std::uint64_t session_hash, bool may_hold, std::uint32_t max_tokens);
  void match_prefix(const RoutableRequest& request, hashing::PrefixIndex::Match& out) const;
  // Load shedding, for a sheddable request: keeps only the candidates with room (--shed-queue-depth,
  // --shed-kv-usage), so it adds nothing to a saturated worker's queue; false when none has room. The
  // thresholds follow the Gateway API Inference Extension's saturation detector, which also sends sheddable
  // requests only to pods below them.
  bool keep_with_room(std::vector<policy::WorkerView>& views) const;
  // The most leading blocks an engine serves from cache for this prompt (UINT32_MAX: no limit known), and
  // `blocks` leading blocks as the tokens an engine would serve.
  static std::uint32_t servable_blocks(const RoutableRequest& request);
  static std::uint64_t servable_tokens(const RoutableRequest& request, std::uint64_t blocks);
  void bind_session(const std::string& hashed_key, hashing::WorkerId worker);
  std::optional<hashing::WorkerId> bound_worker(const std::string& hashed_key) const;
  // WorkerView::sessions, for a request opening a session: the live bindings of each worker (expired ones are
  // dropped first).
  void count_sessions(std::vector<policy::WorkerView>& views);
  // Drops the bindings idle past the TTL (all at the old end), and their counts; sessions_mu_ held.
  void expire_sessions(std::chrono::steady_clock::time_point now);
  // bound_ of a binding that is gone; sessions_mu_ held.
  void uncount(const Binding& b) { --bound_[b.worker].count; }
  std::uint32_t counted_sessions(hashing::WorkerId id) const;
  void add_remote_load(std::vector<policy::WorkerView>& views) const;
  // Ends the request's load on its worker (backends::Worker::end), once: worker_done() or complete().
  void end_load(Decision& d);
  static constexpr std::size_t kMaxHeldBackground = 100'000;
  struct HeldBackground {
    std::shared_ptr<backends::Worker> worker;
    bool first_token = false;
    std::uint64_t uncached = 0, context = 0;
    std::uint64_t prefill_ticket = 0;
    std::chrono::steady_clock::time_point deadline;
    std::uint64_t kv_tokens = 0;
  };
  void hold_background(const Decision& d);
  // Lets go of the held responses whose deadline has passed (and the oldest beyond the cap).
  void expire_background(std::chrono::steady_clock::time_point now);
  void release(const HeldBackground& h);

  const Config& config_;
  backends::WorkerRegistry& registry_;
  std::unique_ptr<policy::RoutingPolicy> policy_;
  RouterMetrics& metrics_;
  // Prefixes being computed, for prefix holds (kv_cost, precise mode); before the index, whose store listener
  // writes it, so that it outlives the index.
  hashing::ComputingPrefixes computing_;
  HoldWaiters hold_waiters_;  // before index_, whose store listener reaches it
  hashing::PrefixIndex index_;
  policy::RateLearner learner_;
  // The largest own context of the recent later turns of sessions (RoutingContext::session_context_tokens).
  policy::RecentQuantile session_context_{policy::kFleetTailWindow, 1.0, 20, 1};
  // The means of recent streamed completions' TTFT, ITL and end-to-end latency (RoutingContext::fleet_means).
  policy::RecentLatencies latencies_;
  CachePools cache_pools_;  // each pool's capacity as one cache, for kvroute_fleet_cache_hit_tokens_total
  std::atomic<std::uint64_t> sequence_{0};

  // At most --max-sessions bindings, the least recently used forgotten first; idle ones expire off the old end.
  // Keyed by session_hash() in hex.
  mutable std::mutex sessions_mu_;
  util::RecencyMap<Binding> sessions_;  // guarded by sessions_mu_
  // Per worker, guarded by sessions_mu_: its bindings, and when a session was last bound to it anew
  // (policy::WorkerView::sessions and session_opened_ago_s).
  struct WorkerSessions {
    std::uint32_t count = 0;
    std::optional<std::chrono::steady_clock::time_point> last_opened;
  };
  std::unordered_map<hashing::WorkerId, WorkerSessions> bound_;

  // Held in the order they were held, which is also deadline order; the cap is kept by expire_background(),
  // which releases what it drops (the map's own capacity would drop entries without releasing them).
  mutable std::mutex background_mu_;
  util::RecencyMap<HeldBackground> background_{std::numeric_limits<std::size_t>::max()};  // guarded by background_mu_
  std::atomic<std::size_t> background_count_{0};  // background_.size(), read without the lock on the routing path

  // Null: a replica alone. The shared state outlives every request that read it here (ReplicaSync::stop()).
  std::atomic<shared_state::SharedState*> shared_{nullptr};
  mutable std::mutex remote_mu_;
  std::shared_ptr<const std::vector<RemoteLoad>> remote_load_;  // guarded by remote_mu_
  double remote_as_of_s_ = 0;                                    // guarded by remote_mu_
  std::mutex stagger_mu_;
  policy::BurstStagger stagger_;  // guarded by stagger_mu_

  // The newest --response-ids ids (the least recently seen forgotten first).
  mutable std::mutex responses_mu_;
  util::RecencyMap<hashing::WorkerId> response_owners_;  // guarded by responses_mu_
};

}  // namespace kvroute::router
