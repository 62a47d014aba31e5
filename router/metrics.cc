#include "router/metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>

#include <prometheus/text_serializer.h>

#include "policy/routing_policy.h"

#ifndef KVROUTE_VERSION
#define KVROUTE_VERSION "unknown"
#endif

namespace kvroute::router {

namespace {
const prometheus::Histogram::BucketBoundaries kLatencyBuckets = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                                                 1,     2.5,  5,     10,   30,  60,  120};
const prometheus::Histogram::BucketBoundaries kDecisionBuckets = {2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4,
                                                                  2e-4, 5e-4, 1e-3, 5e-3, 1e-2};
// Inter-token latency: a decode step takes from a few ms (small batch, small model) to a few hundred ms (large
// batches of long contexts; architecture section 8: step >= weights + KV bytes over memory bandwidth).
const prometheus::Histogram::BucketBoundaries kItlBuckets = {0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075,
                                                             0.1,   0.15,  0.25, 0.5,  1,    2.5};
// Observed / estimated: factors of 2 around 1, finer within 15 % of it (the calibration target).
const prometheus::Histogram::BucketBoundaries kRatioBuckets = {0.125, 0.25, 0.5, 0.7, 0.85, 0.95, 1.05,
                                                               1.15,  1.4,  2,   4,   8};
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
// Every kind kvroute counts in kvroute_errors_total and every routing reason, created at 0.
constexpr const char* kErrorKinds[] = {"bad_request",       "client_disconnected", "accept", "fleet_saturated",
                                       "no_healthy_worker", "upstream",            "worker_rejected"};
constexpr policy::Reason kReasons[] = {policy::Reason::kPrefixHit,   policy::Reason::kSession,
                                       policy::Reason::kLoadFallback, policy::Reason::kCold,
                                       policy::Reason::kOnlyChoice,   policy::Reason::kPreviousResponse};

// A series without labels, registered under its own name.
prometheus::Gauge* gauge(prometheus::Registry& r, const std::string& name, const std::string& help) {
  return &prometheus::BuildGauge().Name(name).Help(help).Register(r).Add({});
}
prometheus::Counter* counter(prometheus::Registry& r, const std::string& name, const std::string& help) {
  return &prometheus::BuildCounter().Name(name).Help(help).Register(r).Add({});
}
prometheus::Family<prometheus::Counter>& counters(prometheus::Registry& r, const std::string& name, const std::string& help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(r);
}
prometheus::Family<prometheus::Gauge>& gauges(prometheus::Registry& r, const std::string& name, const std::string& help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(r);
}
double value_or_nan(std::optional<double> v) { return v ? *v : kNaN; }

// Raises a counter to `now` from what it last took in (`seen`); a source that started again from 0 (a new
// subscriber) adds its whole count.
void advance(prometheus::Counter* c, std::uint64_t now, std::uint64_t seen) {
  c->Increment(static_cast<double>(now >= seen ? now - seen : now));
}

// Brings a counter up to a total kept elsewhere (a process's CPU seconds, the shared state's own counts).
void follow(prometheus::Counter* c, double total) {
  if (total > c->Value()) c->Increment(total - c->Value());
}

// The process as /proc tells it (proc(5)): CPU seconds, memory, descriptors, threads.
struct ProcessSample {
  double cpu_s = 0, rss = 0, vsize = 0, open_fds = 0, max_fds = 0, threads = 0, start_s = 0;
};

// Boot time in seconds since the epoch (proc(5), /proc/stat "btime"); 0 if unknown.
double boot_time() {
  std::ifstream in("/proc/stat");
  for (std::string key; in >> key;) {
    if (key == "btime") {
      double t = 0;
      in >> t;
      return t;
    }
  }
  return 0;
}

ProcessSample sample_process() {
  ProcessSample p;
  std::ifstream stat("/proc/self/stat");
  std::string line;
  std::getline(stat, line);
  // Fields after the command name (which may hold spaces), from field 3 (state) on; proc(5) numbers them.
  if (const auto close = line.rfind(')'); close != std::string::npos) {
    std::istringstream in(line.substr(close + 2));
    std::string f[22];
    for (auto& x : f) in >> x;
    const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
    const auto num = [](const std::string& v) { return v.empty() ? 0.0 : std::strtod(v.c_str(), nullptr); };
    p.cpu_s = (num(f[11]) + num(f[12])) / tick;        // utime (14) + stime (15)
    p.threads = num(f[17]);                             // num_threads (20)
    p.start_s = boot_time() + num(f[19]) / tick;         // starttime (22), clock ticks after boot
    p.vsize = num(f[20]);                               // vsize (23), bytes
    p.rss = num(f[21]) * static_cast<double>(sysconf(_SC_PAGESIZE));  // rss (24), pages
  }
  if (DIR* d = opendir("/proc/self/fd")) {
    while (const dirent* e = readdir(d)) p.open_fds += e->d_name[0] != '.';
    closedir(d);
    p.open_fds -= 1;  // the descriptor opendir() holds
  }
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0) p.max_fds = static_cast<double>(lim.rlim_cur);
  return p;
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
      kv_usage_(prometheus::BuildGauge().Name("kvroute_worker_kv_usage").Help("KV cache usage the worker last reported (0-1); NaN while unknown (not reported, or its polls failing)").Register(*registry_)),
      precise_(prometheus::BuildGauge().Name("kvroute_worker_precise_mode").Help("1 while the worker's KV event stream is live (precise mode), 0 in approximate mode").Register(*registry_)),
      ttft_(prometheus::BuildHistogram().Name("kvroute_ttft_seconds").Help("Time to the first token of successful (2xx) responses, per worker: the first byte of the response body (of a Responses API stream, its first output event)").Register(*registry_)),
      itl_(prometheus::BuildHistogram().Name("kvroute_itl_seconds").Help("Inter-token latency of streamed responses, per worker: the time between two tokens").Register(*registry_)),
      running_(gauges(*registry_, "kvroute_worker_running", "Requests the worker last reported running (vllm:num_requests_running); NaN while unknown")),
      waiting_(gauges(*registry_, "kvroute_worker_waiting", "Requests the worker last reported waiting (vllm:num_requests_waiting); NaN while unknown")),
      worker_sessions_(gauges(*registry_, "kvroute_worker_sessions", "Live session bindings per worker (kv_cost opens a new session where the fewest are bound)")),
      prefill_saved_(counters(*registry_, "kvroute_prefill_seconds_saved_total", "GPU prefill seconds the worker's reported cached tokens saved, at its learned prefill rate")),
      worker_errors_(counters(*registry_, "kvroute_worker_errors_total", "Requests a worker failed, by class: 4xx or 5xx (its HTTP status), connect (not connected to), broken (reset or timed out mid-exchange)")),
      kv_messages_(counters(*registry_, "kvroute_kv_events_messages_total", "Well-formed KV event messages received from the worker (live and replayed)")),
      kv_gaps_(counters(*registry_, "kvroute_kv_events_gaps_total", "Sequence gaps seen in the worker's KV event stream")),
      kv_replays_(counters(*registry_, "kvroute_kv_events_replays_total", "Replay requests the worker answered completely after a gap")),
      kv_malformed_(counters(*registry_, "kvroute_kv_events_malformed_total", "KV event messages dropped as malformed (frames, sizes, undecodable or oversized payloads)")),
      kv_restarts_(counters(*registry_, "kvroute_kv_events_restarts_total", "Publisher restarts seen in the worker's KV event stream (its sequence went backwards)")),
      kv_since_last_(gauges(*registry_, "kvroute_kv_events_last_message_age_seconds", "Seconds since the worker's KV event stream last delivered a message (NaN before the first)")),
      kv_lag_(gauges(*registry_, "kvroute_kv_events_lag_seconds", "Seconds from the engine stamping the worker's last KV event batch to its arrival here (wall clocks; NaN before the first)")),
      tokenize_total_(prometheus::BuildCounter().Name("kvroute_tokenize_total").Help("Text prompts tokenized through a worker's /tokenize, by outcome (cache_hit, tokenized, fallback)").Register(*registry_)) {
  tokenize_seconds_ = &prometheus::BuildHistogram().Name("kvroute_tokenize_seconds").Help("Latency /tokenize added to routing (cache misses)").Register(*registry_).Add({}, kDecisionBuckets);
  decision_ = &prometheus::BuildHistogram().Name("kvroute_routing_decision_seconds").Help("Time to parse, hash, match and pick").Register(*registry_).Add({}, kDecisionBuckets);
  auto& ratio = prometheus::BuildHistogram().Name("kvroute_estimate_ratio").Help("Observed / estimated, per completed streamed request whose routing decision estimated it: the TTFT and the inter-token latency (1 is exact)").Register(*registry_);
  ttft_ratio_ = &ratio.Add({{"estimate", "ttft"}}, kRatioBuckets);
  itl_ratio_ = &ratio.Add({{"estimate", "itl"}}, kRatioBuckets);
  duration_ = &prometheus::BuildHistogram().Name("kvroute_request_duration_seconds").Help("End-to-end request duration").Register(*registry_).Add({}, kLatencyBuckets);
  index_entries_ = gauge(*registry_, "kvroute_index_entries", "(block, worker) entries in the prefix index");
  index_bytes_ = gauge(*registry_, "kvroute_index_bytes", "Memory held by the prefix index");
  sessions_ = gauge(*registry_, "kvroute_sessions", "Session bindings held");
  session_own_context_ = gauge(*registry_, "kvroute_session_own_context_tokens", "Largest context of their own (beyond what other workers hold) that recent later turns of sessions had; kv_cost keeps a new session on its prefix's holder while the holder's sessions beyond the mean, at this size, take less KV than copying the prefix");
  auto& means = gauges(*registry_, "kvroute_fleet_mean_seconds", "Means of the recent streamed requests' TTFT, inter-token latency and end-to-end latency (figure); kv_cost weighs a decision's effect on each by it; 0 until 45 were seen");
  fleet_mean_ttft_ = &means.Add({{"figure", "ttft"}});
  fleet_mean_itl_ = &means.Add({{"figure", "itl"}});
  fleet_mean_e2e_ = &means.Add({{"figure", "e2e"}});
  sessions_evicted_ = counter(*registry_, "kvroute_sessions_evicted_total", "Session bindings forgotten before their TTL because --max-sessions were held");
  held_body_bytes_ = gauge(*registry_, "kvroute_held_body_bytes", "Request body bytes held now, counted against --max-held-body-bytes");
  body_budget_waits_ = counter(*registry_, "kvroute_body_budget_waits_total", "Requests whose body waited, unread, because --max-held-body-bytes of bodies were held");
  admitted_ = gauge(*registry_, "kvroute_admission_in_flight", "API requests holding one of --max-concurrent-requests slots (0 without a cap)");
  queued_ = gauge(*registry_, "kvroute_admission_queued", "API requests waiting for a slot (--max-queued-requests)");
  auto& rejected = counters(*registry_, "kvroute_admission_rejected_total", "API requests answered 429 by admission control: the queue was full (reason=\"queue_full\") or they waited --queue-timeout (reason=\"queue_timeout\")");
  rejected_full_ = &rejected.Add({{"reason", "queue_full"}});
  rejected_timeout_ = &rejected.Add({{"reason", "queue_timeout"}});
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
  staggered_ = counter(*registry_, "kvroute_staggered_requests_total", "Requests that waited for their turn among the router replicas before being routed: they came in a burst that reached several replicas at once (--shared-state-stagger)");
  stagger_seconds_ = counter(*registry_, "kvroute_stagger_seconds_total", "Seconds requests waited for their turn among the router replicas (--shared-state-stagger)");
  auto& warm_ups = prometheus::BuildCounter()
                       .Name("kvroute_warm_ups_total")
                       .Help("Prompts sent alone to a second worker to copy their prefix there, off any request's path (kv_cost's "
                             "bought copies, --warm-ups), by outcome: answered by the worker, or failed (refused, broken, timed out)")
                       .Register(*registry_);
  warm_ups_answered_ = &warm_ups.Add({{"outcome", "answered"}});
  warm_ups_failed_ = &warm_ups.Add({{"outcome", "failed"}});
  auto& lookups = prometheus::BuildCounter()
                      .Name("kvroute_response_lookups_total")
                      .Help("Responses API ids this router had not seen made, looked up on the workers, by result")
                      .Register(*registry_);
  lookups_found_ = &lookups.Add({{"result", "found"}});
  lookups_not_found_ = &lookups.Add({{"result", "not_found"}});
  lookups_skipped_ = &lookups.Add({{"result", "skipped"}});
  auto& retries = counters(*registry_, "kvroute_retries_total",
                           "Requests sent again: to another worker after theirs could not be connected to (kind=\"reroute\"), answered "
                           "502, 503 or 504 (kind=\"status\"), reset or closed the connection (kind=\"broken\") or sent no response "
                           "head within --first-byte-timeout (kind=\"first_byte_timeout\"), or was taken out of rotation while an unstreamed "
                           "request waited for its answer (kind=\"left_rotation\"), all before any byte reached the client; or "
                           "to the same worker on a fresh connection after a pooled one turned out closed (kind=\"fresh_connection\")");
  reroutes_ = &retries.Add({{"kind", "reroute"}});
  retries_fresh_ = &retries.Add({{"kind", "fresh_connection"}});
  retries_status_ = &retries.Add({{"kind", "status"}});
  retries_broken_ = &retries.Add({{"kind", "broken"}});
  retries_first_byte_ = &retries.Add({{"kind", "first_byte_timeout"}});
  retries_left_rotation_ = &retries.Add({{"kind", "left_rotation"}});
  retry_budget_exhausted_ = counter(*registry_, "kvroute_retry_budget_exhausted_total",
                                    "Retries not made because the retry budget was spent (--retry-budget-percent)");
  ejections_ = counter(*registry_, "kvroute_worker_ejections_total",
                       "Workers ejected from rotation by passive outlier detection (--outlier-failures in a row)");
  workers_ejected_ = gauge(*registry_, "kvroute_workers_ejected", "Workers ejected from rotation now");
  streams_cut_ = counter(*registry_, "kvroute_streams_cut_total",
                         "Responses cut after their first byte reached the client (an event stream ends with an error event)");
  pool_reaped_ = counter(*registry_, "kvroute_upstream_connections_reaped_total",
                         "Idle pooled worker connections closed because the worker closed them");
  fleet_prefill_saved_ = counter(*registry_, "kvroute_fleet_prefill_seconds_saved_total", "GPU prefill seconds the fleet's reported cached tokens saved, each at its worker's learned prefill rate");
  workers_total_ = gauge(*registry_, "kvroute_workers", "Workers in the registry (configured, discovered or added)");
  workers_healthy_ = gauge(*registry_, "kvroute_workers_healthy", "Workers passing their health checks");
  workers_routable_ = gauge(*registry_, "kvroute_workers_routable", "Workers a new request may be routed to: healthy and not cordoned");
  for (const char* kind : kErrorKinds) error_kinds_[kind] = &errors_.Add({{"kind", kind}});
  for (const auto reason : kReasons) {
    const std::string name(policy::reason_name(reason));
    reasons_[name] = &routed_.Add({{"reason", name}});
  }
  for (const char* outcome : {"cache_hit", "tokenized", "fallback"}) tokenize_outcomes_[outcome] = &tokenize_total_.Add({{"outcome", outcome}});
  prometheus::BuildGauge()
      .Name("kvroute_build_info")
      .Help("Always 1; the labels say which kvroute this is")
      .Register(*registry_)
      .Add({{"version", KVROUTE_VERSION}, {"compiler", std::string("gcc ") + __VERSION__}})
      .Set(1);
  process_cpu_ = counter(*registry_, "process_cpu_seconds_total", "Total user and system CPU time spent in seconds");
  process_rss_ = gauge(*registry_, "process_resident_memory_bytes", "Resident memory size in bytes");
  process_vsize_ = gauge(*registry_, "process_virtual_memory_bytes", "Virtual memory size in bytes");
  process_open_fds_ = gauge(*registry_, "process_open_fds", "Number of open file descriptors");
  process_max_fds_ = gauge(*registry_, "process_max_fds", "Maximum number of open file descriptors");
  process_threads_ = gauge(*registry_, "process_threads", "Number of OS threads in the process");
  gauge(*registry_, "process_start_time_seconds", "Start time of the process since unix epoch in seconds")
      ->Set(sample_process().start_s);
}

void RouterMetrics::response_lookup(std::string_view result) {
  (result == "found" ? lookups_found_ : result == "not_found" ? lookups_not_found_ : lookups_skipped_)->Increment();
}

void RouterMetrics::add_worker(hashing::WorkerId id, const std::string& name) {
  const prometheus::Labels l{{"worker", name}};
  const auto cls = [&](const char* c) { return &worker_errors_.Add({{"worker", name}, {"class", c}}); };
  auto s = std::make_shared<WorkerSeries>(WorkerSeries{
      &requests_.Add(l), &prompt_tokens_.Add(l), &predicted_.Add(l), &reported_.Add(l), &confirmed_.Add(l), &completion_.Add(l),
      &in_flight_.Add(l), &healthy_.Add(l), &cordoned_.Add(l), &kv_usage_.Add(l), &precise_.Add(l), &ttft_.Add(l, kLatencyBuckets),
      &itl_.Add(l, kItlBuckets), &running_.Add(l), &waiting_.Add(l), &worker_sessions_.Add(l), &prefill_saved_.Add(l), cls("4xx"), cls("5xx"),
      cls("connect"), cls("broken"), &kv_messages_.Add(l), &kv_gaps_.Add(l), &kv_replays_.Add(l), &kv_malformed_.Add(l),
      &kv_restarts_.Add(l), &kv_since_last_.Add(l), &kv_lag_.Add(l), 0, KvEventCounts{}});
  s->healthy->Set(1);
  // Not reported yet: unknown is NaN, never 0 (an idle worker with an empty cache).
  s->kv_usage->Set(kNaN);
  s->running->Set(kNaN);
  s->waiting->Set(kNaN);
  s->kv_since_last->Set(kNaN);
  s->kv_lag->Set(kNaN);
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
  itl_.Remove(s->itl);
  running_.Remove(s->running);
  waiting_.Remove(s->waiting);
  worker_sessions_.Remove(s->sessions);
  prefill_saved_.Remove(s->prefill_saved_s);
  for (auto* c : {s->errors_4xx, s->errors_5xx, s->errors_connect, s->errors_broken}) worker_errors_.Remove(c);
  kv_messages_.Remove(s->kv_messages);
  kv_gaps_.Remove(s->kv_gaps);
  kv_replays_.Remove(s->kv_replays);
  kv_malformed_.Remove(s->kv_malformed);
  kv_restarts_.Remove(s->kv_restarts);
  kv_since_last_.Remove(s->kv_since_last);
  kv_lag_.Remove(s->kv_lag);
}

std::shared_ptr<RouterMetrics::WorkerSeries> RouterMetrics::worker(hashing::WorkerId id) const {
  std::lock_guard lock(mu_);
  auto it = workers_.find(id);
  return it == workers_.end() ? nullptr : it->second;
}

prometheus::Counter& RouterMetrics::labelled(prometheus::Family<prometheus::Counter>& family,
                                             std::unordered_map<std::string, prometheus::Counter*>& slots,
                                             const char* label, const std::string& value) {
  std::lock_guard lock(mu_);
  auto& slot = slots[value];
  if (!slot) slot = &family.Add({{label, value}});
  return *slot;
}

void RouterMetrics::routed(const std::string& reason) { labelled(routed_, reasons_, "reason", reason).Increment(); }

void RouterMetrics::error(const std::string& kind) { labelled(errors_, error_kinds_, "kind", kind).Increment(); }

void RouterMetrics::tokenized(const std::string& outcome, double seconds) {
  labelled(tokenize_total_, tokenize_outcomes_, "outcome", outcome).Increment();
  if (outcome != "cache_hit") tokenize_seconds_->Observe(seconds);
}

void RouterMetrics::upstream_status(hashing::WorkerId id, unsigned status) {
  if (status < 400) return;
  if (status < 500) error("worker_rejected");
  if (auto s = worker(id)) (status < 500 ? s->errors_4xx : s->errors_5xx)->Increment();
}

void RouterMetrics::worker_failure(hashing::WorkerId id, WorkerFailure failure) {
  if (auto s = worker(id)) (failure == WorkerFailure::kConnect ? s->errors_connect : s->errors_broken)->Increment();
}

void RouterMetrics::ttft(hashing::WorkerId id, double seconds, unsigned status) {
  if (status < 200 || status >= 300) return;
  if (auto s = worker(id)) s->ttft->Observe(seconds);
}

void RouterMetrics::itl(hashing::WorkerId id, double seconds) {
  if (auto s = worker(id)) s->itl->Observe(seconds);
}

void RouterMetrics::estimate_ratio(double observed_ttft_s, double estimated_ttft_s, double observed_itl_s,
                                   double estimated_itl_s) {
  if (observed_ttft_s > 0 && estimated_ttft_s > 0) ttft_ratio_->Observe(observed_ttft_s / estimated_ttft_s);
  if (observed_itl_s > 0 && estimated_itl_s > 0) itl_ratio_->Observe(observed_itl_s / estimated_itl_s);
}

void RouterMetrics::retried(RetryKind kind) {
  switch (kind) {
    case RetryKind::kStatus: return retries_status_->Increment();
    case RetryKind::kBroken: return retries_broken_->Increment();
    case RetryKind::kFirstByteTimeout: return retries_first_byte_->Increment();
    case RetryKind::kLeftRotation: return retries_left_rotation_->Increment();
  }
}

void RouterMetrics::set_pool_reaped(std::uint64_t total) {
  std::lock_guard lock(mu_);
  advance(pool_reaped_, total, pool_reaped_seen_);
  pool_reaped_seen_ = total;
}

void RouterMetrics::set_workers(std::size_t total, std::size_t healthy, std::size_t routable) {
  workers_total_->Set(static_cast<double>(total));
  workers_healthy_->Set(static_cast<double>(healthy));
  workers_routable_->Set(static_cast<double>(routable));
}

void RouterMetrics::worker_load(hashing::WorkerId id, std::optional<double> running, std::optional<double> waiting,
                                std::optional<double> kv_usage) {
  auto s = worker(id);
  if (!s) return;
  s->running->Set(value_or_nan(running));
  s->waiting->Set(value_or_nan(waiting));
  s->kv_usage->Set(value_or_nan(kv_usage));
}

void RouterMetrics::sync_prefill_saved(hashing::WorkerId id, double prefill_tokens_per_s) {
  auto s = worker(id);
  if (!s || !(prefill_tokens_per_s > 0)) return;
  double fresh;
  {
    std::lock_guard lock(mu_);
    const double reported = s->reported_cached_tokens->Value();
    fresh = reported - s->priced_cached_tokens;
    s->priced_cached_tokens = reported;
  }
  if (fresh <= 0) return;
  // A cached token is one the worker did not prefill: at P tokens/s it saved 1/P seconds (architecture
  // section 7, prefill_w = m_w / P_w).
  s->prefill_saved_s->Increment(fresh / prefill_tokens_per_s);
  fleet_prefill_saved_->Increment(fresh / prefill_tokens_per_s);
}

void RouterMetrics::sync_kv_events(hashing::WorkerId id, const KvEventCounts& now) {
  auto s = worker(id);
  if (!s) return;
  KvEventCounts seen;
  {
    std::lock_guard lock(mu_);
    seen = s->kv_seen;
    s->kv_seen = now;
  }
  advance(s->kv_messages, now.messages, seen.messages);
  advance(s->kv_gaps, now.gaps, seen.gaps);
  advance(s->kv_replays, now.replays, seen.replays);
  advance(s->kv_malformed, now.malformed, seen.malformed);
  advance(s->kv_restarts, now.restarts, seen.restarts);
  s->kv_since_last->Set(value_or_nan(now.since_last_message_s));
  s->kv_lag->Set(value_or_nan(now.batch_lag_s));
}

void RouterMetrics::update_process() const {
  const ProcessSample p = sample_process();
  follow(process_cpu_, p.cpu_s);
  process_rss_->Set(p.rss);
  process_vsize_->Set(p.vsize);
  process_open_fds_->Set(p.open_fds);
  process_max_fds_->Set(p.max_fds);
  process_threads_->Set(p.threads);
}

void RouterMetrics::shared_state(bool up, std::size_t replicas, std::uint64_t published, std::uint64_t dropped,
                                 std::uint64_t applied, std::uint64_t resyncs) {
  shared_up_->Set(up ? 1 : 0);
  shared_replicas_->Set(static_cast<double>(replicas));
  follow(shared_published_, static_cast<double>(published));
  follow(shared_dropped_, static_cast<double>(dropped));
  follow(shared_applied_, static_cast<double>(applied));
  follow(shared_resyncs_, static_cast<double>(resyncs));
}

std::string RouterMetrics::serialize() const {
  if (collect_hook_) collect_hook_();
  update_process();
  prometheus::TextSerializer s;
  return s.Serialize(registry_->Collect());
}

}  // namespace kvroute::router
