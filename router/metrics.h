// RouterMetrics: kvroute's Prometheus series (served on the admin listener at /metrics).
//
// Fleet-wide and per-worker series; a worker's series are created when it is added and removed with it, so a
// scaled-down fleet leaves no stale labels behind. prometheus-cpp metrics are thread-safe; the per-worker map
// is guarded by mu_.
//
// Hit rate on a dashboard: rate(kvroute_reported_cached_tokens_total) / rate(kvroute_prompt_tokens_total).
// Prediction truth: confirmed / reported is the share of real hits the router foresaw (recall), and
// 1 - confirmed / predicted the share of predicted hits that were not there; confirmed counts, per request,
// min(predicted, reported) cached tokens.
// Cache efficiency: rate(kvroute_fleet_cache_hit_tokens_total{cache="workers"}) / rate(...{cache="shared"}), what
// the workers served from cache against what one LRU holding the fleet's whole KV capacity would have served
// for the same requests (hashing/shared_cache.h).
#pragma once

#include <memory>
#include <mutex>
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
  };

  RouterMetrics();

  void add_worker(hashing::WorkerId id, const std::string& name);
  void remove_worker(hashing::WorkerId id);
  // Null when the worker is unknown (removed meanwhile).
  std::shared_ptr<WorkerSeries> worker(hashing::WorkerId id) const;

  void routed(const std::string& reason);
  void error(const std::string& kind);
  void decision_seconds(double s) { decision_->Observe(s); }
  void request_seconds(double s) { duration_->Observe(s); }
  void set_index(std::size_t entries, std::size_t bytes) {
    index_entries_->Set(static_cast<double>(entries));
    index_bytes_->Set(static_cast<double>(bytes));
  }
  void set_sessions(std::size_t n) { sessions_->Set(static_cast<double>(n)); }
  // Session bindings forgotten, still live, because --max-sessions were held.
  void sessions_evicted(std::size_t n) { sessions_evicted_->Increment(static_cast<double>(n)); }
  // A request waited before its body was read because --max-held-body-bytes were held.
  void body_budget_wait() { body_budget_waits_->Increment(); }
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
  // The totals of the two series above: {workers, shared}.
  std::pair<double, double> fleet_cache_hits() const { return {fleet_hits_workers_->Value(), fleet_hits_shared_->Value()}; }
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
  prometheus::Histogram* decision_;
  prometheus::Histogram* duration_;
  prometheus::Gauge* index_entries_;
  prometheus::Gauge* index_bytes_;
  prometheus::Gauge* sessions_;
  prometheus::Counter* sessions_evicted_;
  prometheus::Counter* body_budget_waits_;
  prometheus::Gauge* held_body_bytes_;
  prometheus::Counter* fleet_hits_workers_;
  prometheus::Counter* fleet_hits_shared_;
  prometheus::Gauge* shared_capacity_;
  prometheus::Gauge* shared_sample_rate_;
  prometheus::Gauge* background_held_;
  prometheus::Counter* prefix_holds_;
  prometheus::Counter* prefix_hold_seconds_;
  prometheus::Family<prometheus::Counter>& tokenize_total_;
  prometheus::Histogram* tokenize_seconds_;
  prometheus::Counter* lookups_found_;
  prometheus::Counter* lookups_not_found_;
  prometheus::Counter* lookups_skipped_;
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
