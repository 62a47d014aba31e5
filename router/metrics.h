// RouterMetrics: kvroute's Prometheus series (served on the admin listener at /metrics).
//
// Fleet-wide and per-worker series; a worker's series are created when it is added and removed with it, so a
// scaled-down fleet leaves no stale labels behind. The `worker` label is the worker's display name (host:port
// unless configured), so label cardinality is bounded by the fleet; every other label takes a fixed set of
// values, all created at zero when the registry is built (an increase() sees the first event). prometheus-cpp
// metrics are thread-safe; the per-worker map is guarded by mu_.
//
// Values the router only knows by asking (the fleet's size, the KV event streams' counters, the process) are
// refreshed by the hook set with on_collect(), which serialize() runs first.
//
// Hit rate on a dashboard: rate(kvroute_reported_cached_tokens_total) / rate(kvroute_prompt_tokens_total).
// Prediction truth: confirmed / reported is the share of real hits the router foresaw (recall), and
// 1 - confirmed / predicted the share of predicted hits that were not there; confirmed counts, per request,
// min(predicted, reported) cached tokens.
// Cache efficiency: rate(kvroute_fleet_cache_hit_tokens_total{cache="workers"}) / rate(...{cache="shared"}), what
// the workers served from cache against what one LRU holding the fleet's whole KV capacity would have served
// for the same requests (hashing/shared_cache.h).
//
//   RouterMetrics m;
//   m.on_collect([&] { m.set_workers(...); });
//   m.add_worker(id, "10.0.0.7:8000");
//   m.upstream_status(id, 503);    // kvroute_errors_total{kind="upstream"}, kvroute_worker_errors_total{class="5xx"}
//   std::string text = m.serialize();
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "hashing/prefix_index.h"

namespace kvroute::router {

// What a worker's KV event subscriber counted so far (events::SubscriberStatus), for sync_kv_events().
struct KvEventCounts {
  std::uint64_t messages = 0;
  std::uint64_t gaps = 0;
  std::uint64_t replays = 0;
  std::uint64_t malformed = 0;
  std::uint64_t restarts = 0;
  std::optional<double> since_last_message_s;  // none: no message yet
  std::optional<double> batch_lag_s;           // engine timestamp to arrival of the last batch; none: not known
};

class RouterMetrics {
 public:
  struct WorkerSeries {
    prometheus::Counter* requests;
    prometheus::Counter* prompt_tokens;
    prometheus::Counter* predicted_cached_tokens;
    prometheus::Counter* reported_cached_tokens;
    prometheus::Counter* confirmed_cached_tokens;
    prometheus::Counter* completion_tokens;
    prometheus::Gauge* in_flight;
    prometheus::Gauge* healthy;
    prometheus::Gauge* cordoned;
    prometheus::Gauge* kv_usage;
    prometheus::Gauge* precise_mode;
    prometheus::Histogram* ttft;
    // Added with the worker like the series above; the members below are written through RouterMetrics.
    prometheus::Histogram* itl;
    prometheus::Gauge* running;
    prometheus::Gauge* waiting;
    prometheus::Gauge* sessions;
    prometheus::Counter* prefill_saved_s;
    prometheus::Counter* errors_4xx;
    prometheus::Counter* errors_5xx;
    prometheus::Counter* errors_connect;
    prometheus::Counter* errors_broken;
    prometheus::Counter* kv_messages;
    prometheus::Counter* kv_gaps;
    prometheus::Counter* kv_replays;
    prometheus::Counter* kv_malformed;
    prometheus::Counter* kv_restarts;
    prometheus::Gauge* kv_since_last;
    prometheus::Gauge* kv_lag;
    // What was last folded into the counters above (guarded by RouterMetrics::mu_).
    double priced_cached_tokens = 0;
    KvEventCounts kv_seen;
  };

  // How a request to a worker failed without an HTTP status of its own (kvroute_worker_errors_total's class).
  enum class WorkerFailure { kConnect, kBroken };

  RouterMetrics();

  void add_worker(hashing::WorkerId id, const std::string& name);
  void remove_worker(hashing::WorkerId id);
  // Null when the worker is unknown (removed meanwhile).
  std::shared_ptr<WorkerSeries> worker(hashing::WorkerId id) const;

  void routed(const std::string& reason);
  // kvroute_errors_total{kind}: one count per failed request. The kinds kvroute uses exist from the start.
  void error(const std::string& kind);
  void decision_seconds(double s) { decision_->Observe(s); }
  void request_seconds(double s) { duration_->Observe(s); }

  // A worker answered with HTTP `status`: a 4xx (the client's request refused, e.g. an unknown model) counts
  // as kvroute_errors_total{kind="worker_rejected"}, never as "upstream", and both 4xx and 5xx count in
  // kvroute_worker_errors_total{worker, class}. 1xx-3xx count nowhere.
  void upstream_status(hashing::WorkerId id, unsigned status);
  // A worker could not be connected to, or the exchange broke (reset, timeout) before its end.
  void worker_failure(hashing::WorkerId id, WorkerFailure failure);
  // Time to first token, observed only for a successful (2xx) response: an error body's first byte is no
  // token. Workers removed meanwhile are skipped by the caller (their id may be another worker's).
  void ttft(hashing::WorkerId id, double seconds, unsigned status);
  // Inter-token latency of a streamed response (seconds between two tokens, or a mean over several).
  void itl(hashing::WorkerId id, double seconds);
  // kvroute_estimate_ratio{estimate="ttft"|"itl"}: observed / estimated, for every completed streamed request
  // whose pick carried estimates (kv_cost's self-check: 1 is a perfect estimate, 3 an estimate 3x short).
  void estimate_ratio(double observed_ttft_s, double estimated_ttft_s, double observed_itl_s, double estimated_itl_s);
  // A request routed again to another worker after its first could not be connected to, and a request
  // retried once on a fresh connection after a pooled one turned out closed.
  void rerouted() { reroutes_->Increment(); }
  void retried_fresh() { retries_fresh_->Increment(); }
  // Why a request was sent to another worker before any byte reached its client (kvroute_retries_total's kind).
  enum class RetryKind { kStatus, kBroken, kFirstByteTimeout, kLeftRotation };
  void retried(RetryKind kind);
  // A retry that was not made: the retry budget was spent (router/retry_budget.h).
  void retry_budget_exhausted() { retry_budget_exhausted_->Increment(); }
  // Passive outlier detection (backends/outlier_detector.h): an ejection, and how many are ejected now.
  void ejected() { ejections_->Increment(); }
  void set_ejected(std::size_t n) { workers_ejected_->Set(static_cast<double>(n)); }
  // A streamed response cut after its first byte (ended with an error event when it was server-sent events).
  void stream_cut() { streams_cut_->Increment(); }
  // Idle pooled connections closed because their worker closed them (backends::UpstreamPool::reaped()).
  void set_pool_reaped(std::uint64_t total);

  // The fleet as the registry holds it (set by the collect hook): every worker, those passing their health
  // checks, and those a request may be routed to (healthy and not cordoned).
  void set_workers(std::size_t total, std::size_t healthy, std::size_t routable);
  // A worker's reported load; none: not reported (or no longer: the poll went stale), exported as NaN.
  void worker_load(hashing::WorkerId id, std::optional<double> running, std::optional<double> waiting,
                   std::optional<double> kv_usage);
  // Prices the cached tokens the worker reported since the last call at its learned prefill rate (tokens/s):
  // kvroute_prefill_seconds_saved_total{worker} and the fleet's kvroute_fleet_prefill_seconds_saved_total.
  void sync_prefill_saved(hashing::WorkerId id, double prefill_tokens_per_s);
  // Brings the KV event stream counters up to the subscriber's (a new subscriber starts again from 0).
  void sync_kv_events(hashing::WorkerId id, const KvEventCounts& counts);
  // Runs before every serialize(): refreshes what is read from elsewhere (set once, before serving).
  void on_collect(std::function<void()> hook) { collect_hook_ = std::move(hook); }

  void set_index(std::size_t entries, std::size_t bytes) {
    index_entries_->Set(static_cast<double>(entries));
    index_bytes_->Set(static_cast<double>(bytes));
  }
  void set_sessions(std::size_t n) { sessions_->Set(static_cast<double>(n)); }
  // The largest own context of the recent later turns of sessions (RoutingContext::session_context_tokens).
  void set_session_own_context(double tokens) { session_own_context_->Set(tokens); }
  // The means kv_cost weighs its terms with (RoutingContext::fleet_means), 0 while unknown.
  void set_fleet_means(double ttft_s, double itl_s, double e2e_s) {
    fleet_mean_ttft_->Set(ttft_s);
    fleet_mean_itl_->Set(itl_s);
    fleet_mean_e2e_->Set(e2e_s);
  }
  // Session bindings forgotten, still live, because --max-sessions were held.
  void sessions_evicted(std::size_t n) { sessions_evicted_->Increment(static_cast<double>(n)); }
  // A request waited before its body was read because --max-held-body-bytes were held.
  void body_budget_wait() { body_budget_waits_->Increment(); }
  // Admission control (router/admission.h): API requests holding a slot and waiting for one (set when /metrics
  // is read), and requests refused with 429 by reason: queue_full, queue_timeout.
  void set_admission(std::size_t in_flight, std::size_t queued) {
    admitted_->Set(static_cast<double>(in_flight));
    queued_->Set(static_cast<double>(queued));
  }
  void admission_rejected(bool timed_out) { (timed_out ? rejected_timeout_ : rejected_full_)->Increment(); }
  // Request body bytes held now (set when /metrics is read).
  void set_held_body_bytes(std::uint64_t n) { held_body_bytes_->Set(static_cast<double>(n)); }
  // One request measured against the shared cache: the cached tokens its worker reported and those one LRU of
  // the fleet's capacity would have had.
  void fleet_cache_hits(std::uint64_t workers, std::uint64_t shared) {
    fleet_hits_workers_->Increment(static_cast<double>(workers));
    fleet_hits_shared_->Increment(static_cast<double>(shared));
  }
  // Background responses whose load is held on their worker (Router::holds_background).
  void set_background_held(std::size_t n) { background_held_->Set(static_cast<double>(n)); }
  // A request held for a prefix being computed (kv_cost's prefix hold) went on after `seconds`.
  void prefix_held(double seconds) {
    prefix_holds_->Increment();
    prefix_hold_seconds_->Increment(seconds);
  }
  // A warm-up (router/warm_up.h) ended: answered by its worker, or not (refused, failed, timed out).
  void warm_up(bool answered) { (answered ? warm_ups_answered_ : warm_ups_failed_)->Increment(); }
  // A request waited `seconds` for its turn among the replicas before being routed (Router::stagger_s).
  void staggered(double seconds) {
    staggered_->Increment();
    stagger_seconds_->Increment(seconds);
  }
  // The totals of the two series above: {workers, shared}.
  std::pair<double, double> fleet_cache_hits() const { return {fleet_hits_workers_->Value(), fleet_hits_shared_->Value()}; }
  // Set when a request resizes a pool's cache, and by the collect hook from the routable workers, so that the
  // capacity follows workers removed or taken out of rotation even while no request is routed.
  void set_shared_cache(std::uint64_t capacity_blocks, double sample_rate) {
    shared_capacity_->Set(static_cast<double>(capacity_blocks));
    shared_sample_rate_->Set(sample_rate);
  }
  // A /tokenize outcome (cache_hit, tokenized, fallback) and the time it took.
  void tokenized(const std::string& outcome, double seconds);
  // A Responses API id whose worker this router did not know, looked up on the workers: found, not_found,
  // or skipped (too many lookups under way).
  void response_lookup(std::string_view result);
  // Router replicas (router/replica_sync.h): whether Redis is reachable, the other replicas publishing load,
  // and the shared state's running totals (counters follow them).
  void shared_state(bool up, std::size_t replicas, std::uint64_t published, std::uint64_t dropped,
                    std::uint64_t applied, std::uint64_t resyncs);

  std::string serialize() const;

 private:
  // A labelled series created on first use (kinds outside the pre-created set), under mu_.
  prometheus::Counter& labelled(prometheus::Family<prometheus::Counter>& family,
                                std::unordered_map<std::string, prometheus::Counter*>& slots, const char* label,
                                const std::string& value);
  void update_process() const;

  std::shared_ptr<prometheus::Registry> registry_ = std::make_shared<prometheus::Registry>();
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Counter>& routed_;
  prometheus::Family<prometheus::Counter>& errors_;
  prometheus::Family<prometheus::Counter>& prompt_tokens_;
  prometheus::Family<prometheus::Counter>& predicted_;
  prometheus::Family<prometheus::Counter>& reported_;
  prometheus::Family<prometheus::Counter>& confirmed_;
  prometheus::Family<prometheus::Counter>& completion_;
  prometheus::Family<prometheus::Gauge>& in_flight_;
  prometheus::Family<prometheus::Gauge>& healthy_;
  prometheus::Family<prometheus::Gauge>& cordoned_;
  prometheus::Family<prometheus::Gauge>& kv_usage_;
  prometheus::Family<prometheus::Gauge>& precise_;
  prometheus::Family<prometheus::Histogram>& ttft_;
  prometheus::Family<prometheus::Histogram>& itl_;
  prometheus::Family<prometheus::Gauge>& running_;
  prometheus::Family<prometheus::Gauge>& waiting_;
  prometheus::Family<prometheus::Gauge>& worker_sessions_;
  prometheus::Family<prometheus::Counter>& prefill_saved_;
  prometheus::Family<prometheus::Counter>& worker_errors_;
  prometheus::Family<prometheus::Counter>& kv_messages_;
  prometheus::Family<prometheus::Counter>& kv_gaps_;
  prometheus::Family<prometheus::Counter>& kv_replays_;
  prometheus::Family<prometheus::Counter>& kv_malformed_;
  prometheus::Family<prometheus::Counter>& kv_restarts_;
  prometheus::Family<prometheus::Gauge>& kv_since_last_;
  prometheus::Family<prometheus::Gauge>& kv_lag_;
  prometheus::Histogram* decision_;
  prometheus::Histogram* ttft_ratio_;
  prometheus::Histogram* itl_ratio_;
  prometheus::Histogram* duration_;
  prometheus::Gauge* index_entries_;
  prometheus::Gauge* index_bytes_;
  prometheus::Gauge* sessions_;
  prometheus::Gauge* session_own_context_;
  prometheus::Gauge* fleet_mean_ttft_;
  prometheus::Gauge* fleet_mean_itl_;
  prometheus::Gauge* fleet_mean_e2e_;
  prometheus::Counter* sessions_evicted_;
  prometheus::Counter* body_budget_waits_;
  prometheus::Gauge* held_body_bytes_;
  prometheus::Gauge* admitted_;
  prometheus::Gauge* queued_;
  prometheus::Counter* rejected_full_;
  prometheus::Counter* rejected_timeout_;
  prometheus::Counter* fleet_hits_workers_;
  prometheus::Counter* fleet_hits_shared_;
  prometheus::Gauge* shared_capacity_;
  prometheus::Gauge* shared_sample_rate_;
  prometheus::Gauge* background_held_;
  prometheus::Counter* prefix_holds_;
  prometheus::Counter* prefix_hold_seconds_;
  prometheus::Counter* staggered_;
  prometheus::Counter* warm_ups_answered_;
  prometheus::Counter* warm_ups_failed_;
  prometheus::Counter* stagger_seconds_;
  prometheus::Family<prometheus::Counter>& tokenize_total_;
  prometheus::Histogram* tokenize_seconds_;
  prometheus::Counter* lookups_found_;
  prometheus::Counter* lookups_not_found_;
  prometheus::Counter* lookups_skipped_;
  prometheus::Counter* reroutes_;
  prometheus::Counter* retries_fresh_;
  prometheus::Counter* retries_status_;
  prometheus::Counter* retries_broken_;
  prometheus::Counter* retries_first_byte_;
  prometheus::Counter* retries_left_rotation_;
  prometheus::Counter* retry_budget_exhausted_;
  prometheus::Counter* ejections_;
  prometheus::Gauge* workers_ejected_;
  prometheus::Counter* streams_cut_;
  prometheus::Counter* pool_reaped_;
  std::uint64_t pool_reaped_seen_ = 0;  // guarded by mu_
  prometheus::Counter* fleet_prefill_saved_;
  prometheus::Gauge* workers_total_;
  prometheus::Gauge* workers_healthy_;
  prometheus::Gauge* workers_routable_;
  // process_* (the Prometheus client libraries' standard process collector), refreshed by serialize().
  prometheus::Counter* process_cpu_;
  prometheus::Gauge* process_rss_;
  prometheus::Gauge* process_vsize_;
  prometheus::Gauge* process_open_fds_;
  prometheus::Gauge* process_max_fds_;
  prometheus::Gauge* process_threads_;
  std::function<void()> collect_hook_;
  prometheus::Gauge* shared_up_;
  prometheus::Gauge* shared_replicas_;
  prometheus::Counter* shared_published_;
  prometheus::Counter* shared_dropped_;
  prometheus::Counter* shared_applied_;
  prometheus::Counter* shared_resyncs_;

  mutable std::mutex mu_;
  std::unordered_map<hashing::WorkerId, std::shared_ptr<WorkerSeries>> workers_;  // guarded by mu_
  std::unordered_map<std::string, prometheus::Counter*> reasons_;                 // guarded by mu_
  std::unordered_map<std::string, prometheus::Counter*> error_kinds_;             // guarded by mu_
  std::unordered_map<std::string, prometheus::Counter*> tokenize_outcomes_;       // guarded by mu_
};

}  // namespace kvroute::router
