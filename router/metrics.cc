#include "router/metrics.h"

#include <prometheus/text_serializer.h>

namespace kvroute::router {

namespace {
const prometheus::Histogram::BucketBoundaries kLatencyBuckets = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                                                 1,     2.5,  5,     10,   30,  60,  120};
const prometheus::Histogram::BucketBoundaries kDecisionBuckets = {2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4,
                                                                  2e-4, 5e-4, 1e-3, 5e-3, 1e-2};

// A series without labels, registered under its own name.
prometheus::Gauge* gauge(prometheus::Registry& r, const std::string& name, const std::string& help) {
  return &prometheus::BuildGauge().Name(name).Help(help).Register(r).Add({});
}
prometheus::Counter* counter(prometheus::Registry& r, const std::string& name, const std::string& help) {
  return &prometheus::BuildCounter().Name(name).Help(help).Register(r).Add({});
}
}  // namespace

RouterMetrics::RouterMetrics()
    : requests_(prometheus::BuildCounter().Name("kvroute_requests_total").Help("Requests routed to each worker").Register(*registry_)),
      routed_(prometheus::BuildCounter().Name("kvroute_routing_decisions_total").Help("Routing decisions by reason").Register(*registry_)),
      errors_(prometheus::BuildCounter().Name("kvroute_errors_total").Help("Requests that failed, by kind").Register(*registry_)),
      prompt_tokens_(prometheus::BuildCounter().Name("kvroute_prompt_tokens_total").Help("Prompt tokens served, as workers report them").Register(*registry_)),
      predicted_(prometheus::BuildCounter().Name("kvroute_predicted_cached_tokens_total").Help("Prompt tokens the router predicted to be cached on the chosen worker").Register(*registry_)),
      reported_(prometheus::BuildCounter().Name("kvroute_reported_cached_tokens_total").Help("Cached prompt tokens the workers reported (usage.prompt_tokens_details.cached_tokens)").Register(*registry_)),
      confirmed_(prometheus::BuildCounter().Name("kvroute_confirmed_cached_tokens_total").Help("Per request, min(predicted, reported) cached tokens: predictions the worker confirmed").Register(*registry_)),
      completion_(prometheus::BuildCounter().Name("kvroute_completion_tokens_total").Help("Completion tokens the workers reported").Register(*registry_)),
      in_flight_(prometheus::BuildGauge().Name("kvroute_worker_in_flight").Help("Requests in flight per worker").Register(*registry_)),
      healthy_(prometheus::BuildGauge().Name("kvroute_worker_healthy").Help("1 when the worker passes health checks").Register(*registry_)),
      cordoned_(prometheus::BuildGauge().Name("kvroute_worker_cordoned").Help("1 while the worker is cordoned: no new requests are routed to it").Register(*registry_)),
      kv_usage_(prometheus::BuildGauge().Name("kvroute_worker_kv_usage").Help("KV cache usage the worker last reported (0-1)").Register(*registry_)),
      precise_(prometheus::BuildGauge().Name("kvroute_worker_precise_mode").Help("1 while the worker's KV event stream is live (precise mode), 0 in approximate mode").Register(*registry_)),
      ttft_(prometheus::BuildHistogram().Name("kvroute_ttft_seconds").Help("Time to the first token, per worker: the first byte of the response body (of a Responses API stream, its first output event)").Register(*registry_)),
      tokenize_total_(prometheus::BuildCounter().Name("kvroute_tokenize_total").Help("Text prompts tokenized through a worker's /tokenize, by outcome (cache_hit, tokenized, fallback)").Register(*registry_)) {
  tokenize_seconds_ = &prometheus::BuildHistogram().Name("kvroute_tokenize_seconds").Help("Latency /tokenize added to routing (cache misses)").Register(*registry_).Add({}, kDecisionBuckets);
  decision_ = &prometheus::BuildHistogram().Name("kvroute_routing_decision_seconds").Help("Time to parse, hash, match and pick").Register(*registry_).Add({}, kDecisionBuckets);
  duration_ = &prometheus::BuildHistogram().Name("kvroute_request_duration_seconds").Help("End-to-end request duration").Register(*registry_).Add({}, kLatencyBuckets);
  index_entries_ = gauge(*registry_, "kvroute_index_entries", "(block, worker) entries in the prefix index");
  index_bytes_ = gauge(*registry_, "kvroute_index_bytes", "Memory held by the prefix index");
  sessions_ = gauge(*registry_, "kvroute_sessions", "Session bindings held");
  sessions_evicted_ = counter(*registry_, "kvroute_sessions_evicted_total", "Session bindings forgotten before their TTL because --max-sessions were held");
  held_body_bytes_ = gauge(*registry_, "kvroute_held_body_bytes", "Request body bytes held now, counted against --max-held-body-bytes");
  body_budget_waits_ = counter(*registry_, "kvroute_body_budget_waits_total", "Requests whose body waited, unread, because --max-held-body-bytes of bodies were held");
  auto& fleet_hits = prometheus::BuildCounter()
                         .Name("kvroute_fleet_cache_hit_tokens_total")
                         .Help("Cached prompt tokens of the requests whose usage was reported: as their workers reported them "
                               "(cache=\"workers\"), and as one LRU cache holding the whole KV capacity of their worker's pool (the "
                               "workers serving the same models) would have served them (cache=\"shared\")")
                         .Register(*registry_);
  fleet_hits_workers_ = &fleet_hits.Add({{"cache", "workers"}});
  fleet_hits_shared_ = &fleet_hits.Add({{"cache", "shared"}});
  shared_capacity_ = gauge(*registry_, "kvroute_shared_cache_capacity_blocks", "KV capacity of the healthy workers, in blocks: the size of the shared caches (one per pool of workers serving the same models) the fleet is measured against");
  shared_sample_rate_ = gauge(*registry_, "kvroute_shared_cache_sample_rate", "Share of blocks the sparsest shared cache keeps (1 = exact; less on pools too large to model exactly)");
  background_held_ = gauge(*registry_, "kvroute_background_responses_held", "Background responses (Responses API) queued on a worker and counted as its load until they end");
  shared_up_ = gauge(*registry_, "kvroute_shared_state_up", "1 while the shared state (--shared-state) is reachable and in step; 0 while this replica routes alone");
  shared_replicas_ = gauge(*registry_, "kvroute_shared_state_replicas", "Other router replicas whose load is in the shared state");
  shared_published_ = counter(*registry_, "kvroute_shared_state_commands_total", "Commands this replica sent to the shared state (records, load, bindings, lookups)");
  shared_dropped_ = counter(*registry_, "kvroute_shared_state_dropped_total", "Records not sent to the shared state: its queue was full (the oldest go) or the connection broke");
  shared_applied_ = counter(*registry_, "kvroute_shared_state_applied_total", "Records of other replicas applied here (routed prefixes, response owners, admin changes)");
  shared_resyncs_ = counter(*registry_, "kvroute_shared_state_resyncs_total", "Times this replica read the shared state back: at start, after Redis came back, after falling behind the stream");
  prefix_holds_ = counter(*registry_, "kvroute_prefix_holds_total", "Requests held until the prefix an earlier request was computing on their worker landed, so as not to compute it again (--prefix-hold)");
  prefix_hold_seconds_ = counter(*registry_, "kvroute_prefix_hold_seconds_total", "Seconds requests spent held for a prefix being computed (--prefix-hold)");
  auto& lookups = prometheus::BuildCounter()
                      .Name("kvroute_response_lookups_total")
                      .Help("Responses API ids this router had not seen made, looked up on the workers, by result")
                      .Register(*registry_);
  lookups_found_ = &lookups.Add({{"result", "found"}});
  lookups_not_found_ = &lookups.Add({{"result", "not_found"}});
  lookups_skipped_ = &lookups.Add({{"result", "skipped"}});
}

void RouterMetrics::response_lookup(std::string_view result) {
  (result == "found" ? lookups_found_ : result == "not_found" ? lookups_not_found_ : lookups_skipped_)->Increment();
}

void RouterMetrics::add_worker(hashing::WorkerId id, const std::string& name) {
  const prometheus::Labels l{{"worker", name}};
  auto s = std::make_shared<WorkerSeries>(WorkerSeries{
      &requests_.Add(l), &prompt_tokens_.Add(l), &predicted_.Add(l), &reported_.Add(l), &confirmed_.Add(l), &completion_.Add(l),
      &in_flight_.Add(l), &healthy_.Add(l), &cordoned_.Add(l), &kv_usage_.Add(l), &precise_.Add(l), &ttft_.Add(l, kLatencyBuckets)});
  s->healthy->Set(1);
  std::lock_guard lock(mu_);
  workers_[id] = std::move(s);
}

void RouterMetrics::remove_worker(hashing::WorkerId id) {
  std::shared_ptr<WorkerSeries> s;
  {
    std::lock_guard lock(mu_);
    auto it = workers_.find(id);
    if (it == workers_.end()) return;
    s = it->second;
    workers_.erase(it);
  }
  requests_.Remove(s->requests);
  prompt_tokens_.Remove(s->prompt_tokens);
  predicted_.Remove(s->predicted_cached_tokens);
  reported_.Remove(s->reported_cached_tokens);
  confirmed_.Remove(s->confirmed_cached_tokens);
  completion_.Remove(s->completion_tokens);
  in_flight_.Remove(s->in_flight);
  healthy_.Remove(s->healthy);
  cordoned_.Remove(s->cordoned);
  kv_usage_.Remove(s->kv_usage);
  precise_.Remove(s->precise_mode);
  ttft_.Remove(s->ttft);
}

std::shared_ptr<RouterMetrics::WorkerSeries> RouterMetrics::worker(hashing::WorkerId id) const {
  std::lock_guard lock(mu_);
  auto it = workers_.find(id);
  return it == workers_.end() ? nullptr : it->second;
}

void RouterMetrics::routed(const std::string& reason) {
  prometheus::Counter* c;
  {
    std::lock_guard lock(mu_);
    auto& slot = reasons_[reason];
    if (!slot) slot = &routed_.Add({{"reason", reason}});
    c = slot;
  }
  c->Increment();
}

void RouterMetrics::error(const std::string& kind) {
  prometheus::Counter* c;
  {
    std::lock_guard lock(mu_);
    auto& slot = error_kinds_[kind];
    if (!slot) slot = &errors_.Add({{"kind", kind}});
    c = slot;
  }
  c->Increment();
}

void RouterMetrics::tokenized(const std::string& outcome, double seconds) {
  prometheus::Counter* c;
  {
    std::lock_guard lock(mu_);
    auto& slot = tokenize_outcomes_[outcome];
    if (!slot) slot = &tokenize_total_.Add({{"outcome", outcome}});
    c = slot;
  }
  c->Increment();
  if (outcome != "cache_hit") tokenize_seconds_->Observe(seconds);
}

void RouterMetrics::shared_state(bool up, std::size_t replicas, std::uint64_t published, std::uint64_t dropped,
                                 std::uint64_t applied, std::uint64_t resyncs) {
  shared_up_->Set(up ? 1 : 0);
  shared_replicas_->Set(static_cast<double>(replicas));
  auto follow = [](prometheus::Counter* c, std::uint64_t total) {
    if (const double now = static_cast<double>(total); now > c->Value()) c->Increment(now - c->Value());
  };
  follow(shared_published_, published);
  follow(shared_dropped_, dropped);
  follow(shared_applied_, applied);
  follow(shared_resyncs_, resyncs);
}

std::string RouterMetrics::serialize() const {
  prometheus::TextSerializer s;
  return s.Serialize(registry_->Collect());
}

}  // namespace kvroute::router
