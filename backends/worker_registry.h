// WorkerRegistry: the fleet as the router sees it: endpoints, health, router-tracked load, reported telemetry
// and learned performance (architecture section 2).
//
// Workers are added and removed only through the registry; listeners hear about both (the prefix index drops
// a removed worker's entries, metrics drop its series). Readers take an immutable snapshot of the worker list
// (a shared_ptr swapped under a mutex), so routing never holds the registry lock while it works. Per-worker
// counters are atomics; reported telemetry sits behind the worker's own mutex.
//
//   WorkerRegistry reg;
//   auto id = reg.add(*parse_worker_url("http://10.0.0.7:8000"));
//   auto snap = reg.snapshot();                 // std::shared_ptr<const WorkerList>
//   std::vector<policy::WorkerView> views; reg.fill_views(*snap, views);
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hashing/prefix_index.h"
#include "policy/prefill_queue.h"
#include "policy/routing_policy.h"
#include "util/result.h"

namespace kvroute::backends {

using hashing::WorkerId;

// Who added, removed or cordoned a worker. Router replicas share what an operator did (the admin API) and
// nothing else: each replica reads its own configuration and DNS, and what came from another replica is not
// sent back (backends/shared_state/shared_state.h).
enum class Origin : std::uint8_t {
  kOperator,   // the admin API (the default: an endpoint parsed from a URL the operator gave at run time)
  kConfig,     // --worker / the config file
  kDiscovery,  // --discover
  kShared,     // another router replica, through the shared state
};

struct WorkerEndpoint {
  std::string url;   // as configured, e.g. http://127.0.0.1:8001
  std::string host;
  std::string port;  // service name or number, for the resolver
  std::string name;  // display name: host:port unless configured
  std::string kv_events_endpoint;  // optional ZMQ endpoint of the worker's KV event publisher
  std::string kv_events_replay;    // optional ZMQ endpoint of its replay socket
  std::string model;               // namespace of its KV events; empty: learned from its /v1/models
  std::uint32_t dp_size = 1;       // data-parallel ranks publishing events (port + rank)
  Origin origin = Origin::kOperator;  // who added it
};

// Parses http://HOST:PORT[/] (IPv6 as [::1]); errors explain what is wrong with the URL.
Result<WorkerEndpoint> parse_worker_url(std::string_view url);

// What a worker's /metrics said at the last poll.
struct WorkerTelemetry {
  std::uint32_t running = 0;
  std::uint32_t waiting = 0;
  double kv_usage = 0.0;
  bool kv_usage_reported = false;  // kv_usage came from the engine (else 0 stands for unknown)
  std::uint64_t num_gpu_blocks = 0;
  std::uint32_t block_size = 0;
  bool valid = false;
  // Worker::ended() when the report was asked for: the requests that ended after it are no longer running
  // (policy::settle_report), although the report counts them until the next one.
  std::uint64_t ended_at_report = 0;
};

class Worker {
 public:
  Worker(WorkerId id, WorkerEndpoint endpoint, std::uint64_t serial = 0)
      : id_(id), serial_(serial), endpoint_(std::move(endpoint)) {}

  WorkerId id() const { return id_; }
  // Ids are reused once a worker is removed; serials are not. State keyed by id that can outlive the worker
  // (pooled connections) carries the serial as well.
  std::uint64_t serial() const { return serial_; }
  // Set when the registry removes the worker. Requests still in flight to it finish, but what they report no
  // longer updates state keyed by id (the index, learned rates, per-worker metrics): the id's next worker may
  // own it by then.
  bool removed() const { return removed_.load(std::memory_order_relaxed); }
  void set_removed(Origin by = Origin::kOperator) {
    removed_by_ = by;
    removed_.store(true, std::memory_order_release);
  }
  // Who removed it (read once removed() is true).
  Origin removed_by() const { return removed_by_; }
  const WorkerEndpoint& endpoint() const { return endpoint_; }
  const std::string& name() const { return endpoint_.name; }

  bool healthy() const { return healthy_.load(std::memory_order_relaxed); }
  void set_healthy(bool h) { healthy_.store(h, std::memory_order_relaxed); }
  // Takes the worker out of rotation; true when this call did (it was healthy), so one caller reports it.
  bool mark_unhealthy() { return healthy_.exchange(false, std::memory_order_relaxed); }

  // Cordoned by the operator (POST /admin/workers/NAME/cordon): no new request is routed to it, while the
  // requests in flight finish, continuations of the responses it stores still reach it, and what the router
  // learned about it (index, rates, sessions elsewhere) is kept. Independent of health.
  bool cordoned() const { return cordoned_.load(std::memory_order_relaxed); }
  // A change is told to the registry's listeners (Listener::cordon_changed) with who made it.
  void set_cordoned(bool c, Origin by = Origin::kOperator);
  // Healthy, not cordoned and not ejected: it may be given a new request.
  bool routable() const { return healthy() && !cordoned() && !ejected(); }

  // Passive outlier detection (backends/outlier_detector.h): a worker whose requests kept failing is ejected
  // until a point on the steady clock, independently of its health checks (a worker can pass /health and still
  // fail every request). Written by the OutlierDetector; read lock-free by routing.
  bool ejected(std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now()) const {
    return ejected_until_ns_.load(std::memory_order_relaxed) > now.time_since_epoch().count();
  }
  // When its ejection ends (the epoch when it was never ejected).
  std::chrono::steady_clock::time_point ejected_until() const {
    return std::chrono::steady_clock::time_point(
        std::chrono::steady_clock::duration(ejected_until_ns_.load(std::memory_order_relaxed)));
  }
  // Ejections so far (the admin API's "ejections").
  std::uint32_t ejections() const { return ejections_.load(std::memory_order_relaxed); }
  // Failed requests in a row since its last success or ejection.
  std::uint32_t consecutive_failures() const { return consecutive_failures_.load(std::memory_order_relaxed); }

  // Precise mode: the worker's KV event stream is live, so the index holds what it reports and the router
  // records no predictions for it. Approximate mode otherwise.
  bool precise() const { return precise_.load(std::memory_order_relaxed); }
  void set_precise(bool p) { precise_.store(p, std::memory_order_relaxed); }

  // Router-tracked load: begin() when a request is sent, first_token() when its first byte comes back,
  // end() when it completes (any outcome). Every begin() is matched by exactly one end(). begin() also queues
  // the request's estimated prefill seconds (policy::prefill_seconds) and returns its ticket, which
  // first_token() and end() take back: the view reports the queue's total, its oldest entry and the time since
  // the worker's last first token (policy::WorkerView::pending_prefill_s).
  // `kv_tokens` (policy::WorkerView::inflight_kv_tokens): the KV the request will have allocated at its end,
  // its uncached prompt tokens plus its output; end() takes the same number back.
  std::uint64_t begin(std::uint64_t uncached_prompt_tokens, double prefill_s, std::uint64_t kv_tokens = 0);
  void first_token(std::uint64_t ticket, std::uint64_t uncached_prompt_tokens, std::uint64_t context_tokens);
  void end(std::uint64_t ticket, bool had_first_token, std::uint64_t uncached_prompt_tokens,
           std::uint64_t context_tokens, std::uint64_t kv_tokens = 0);
  std::uint32_t in_flight() const { return in_flight_.load(std::memory_order_relaxed); }
  // Requests that ended on the worker: this replica's (every end()), and the other router replicas' as the
  // shared state last told them (--shared-state; set_others_ended). Their sum, ended(), dates the worker's
  // reported running and waiting counts (WorkerTelemetry::ended_at_report).
  std::uint64_t ended_here() const { return ended_.load(std::memory_order_relaxed); }
  std::uint64_t others_ended() const { return others_ended_.load(std::memory_order_relaxed); }
  void set_others_ended(std::uint64_t n) { others_ended_.store(n, std::memory_order_relaxed); }
  std::uint64_t ended() const { return ended_here() + others_ended(); }
  std::uint64_t pending_prefill_tokens() const { return pending_prefill_.load(std::memory_order_relaxed); }
  std::uint64_t active_decode_tokens() const { return active_decode_.load(std::memory_order_relaxed); }

  void set_telemetry(const WorkerTelemetry& t);
  WorkerTelemetry telemetry() const;

  // The models the worker serves: the ids of its /v1/models (served names and loaded LoRA adapters), as the
  // health checker last read them. Until then it is taken to serve any model.
  void set_models(std::vector<std::string> models);
  std::vector<std::string> models() const;
  bool serves(std::string_view model) const;
  // Bumped whenever set_models() changes the list, so readers can tell cheaply whether it changed.
  std::uint64_t models_version() const { return models_version_.load(std::memory_order_acquire); }

  // Router-tracked load and reported telemetry; performance rates are filled in by the router's learner.
  // `now` dates the prefill queue's elapsed time (one clock read for a whole snapshot in fill_views()).
  policy::WorkerView view(std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now()) const;

 private:
  void leave_prefill_queue(std::uint64_t ticket, bool first_token);
  void publish_prefill_queue();  // with prefill_mu_ held

  friend class WorkerRegistry;
  friend class OutlierDetector;
  const WorkerId id_;
  const std::uint64_t serial_;
  const WorkerEndpoint endpoint_;
  // Set by the registry before the worker is published; tells its listeners of cordon changes.
  std::function<void(const Worker&, bool, Origin)> cordon_hook_;
  std::atomic<bool> removed_{false};
  Origin removed_by_ = Origin::kOperator;  // written before removed_ is set (release), read after
  std::atomic<bool> healthy_{true};
  std::atomic<bool> precise_{false};
  std::atomic<bool> cordoned_{false};
  // Outlier detection state, written by OutlierDetector (ejections under its lock).
  std::atomic<std::chrono::steady_clock::rep> ejected_until_ns_{0};
  std::atomic<std::uint32_t> ejections_{0};
  std::atomic<std::uint32_t> consecutive_failures_{0};
  std::uint32_t ejection_multiplier_ = 0;         // guarded by OutlierDetector's lock
  std::chrono::steady_clock::time_point multiplier_at_{};  // ... when it was last brought up to date
  std::atomic<std::uint32_t> in_flight_{0};
  std::atomic<std::uint64_t> pending_prefill_{0};
  std::atomic<std::uint64_t> active_decode_{0};
  std::atomic<std::uint64_t> inflight_kv_{0};
  std::atomic<std::uint64_t> ended_{0};
  std::atomic<std::uint64_t> others_ended_{0};
  std::atomic<std::uint64_t> models_version_{0};
  mutable std::mutex mu_;
  WorkerTelemetry telemetry_;  // guarded by mu_
  // Requests sent and not past their first token, by ticket (seconds on the steady clock). Writers update it
  // under prefill_mu_ and publish the summary view() reads without a lock: its total, its oldest entry (-1 when
  // empty) and when the worker last returned a first token (PrefillQueue::since).
  std::mutex prefill_mu_;
  policy::PrefillQueue prefill_queue_;  // guarded by prefill_mu_
  std::uint64_t next_ticket_ = 1;       // guarded by prefill_mu_
  std::atomic<double> prefill_total_s_{0.0};
  std::atomic<double> prefill_oldest_s_{-1.0};
  std::atomic<double> prefill_since_s_{0.0};
  std::vector<std::string> models_;  // guarded by mu_; empty: not known
};

using WorkerList = std::vector<std::shared_ptr<Worker>>;

class WorkerRegistry {
 public:
  struct Listener {
    std::function<void(const Worker&)> added;
    std::function<void(const Worker&)> removed;  // Worker::removed_by() says who removed it
    std::function<void(const Worker&, bool cordoned, Origin by)> cordon_changed;  // optional
  };

  // Adds a worker (a URL already present is an error) and returns its id. Ids are dense and reused.
  Result<WorkerId> add(WorkerEndpoint endpoint);
  bool remove(WorkerId id, Origin by = Origin::kOperator);
  void subscribe(Listener l);

  // The current list. Keep the pointer while walking it: `for (auto& w : *reg.snapshot())` drops it before the
  // loop body runs, and an add or remove on another thread then frees the list under the loop.
  std::shared_ptr<const WorkerList> snapshot() const;
  std::shared_ptr<Worker> find(WorkerId id) const;
  std::shared_ptr<Worker> find_by_url(std::string_view url) const;
  // By display name, or by id written in decimal (the admin API's NAME); null when no worker matches.
  std::shared_ptr<Worker> find_by_name(std::string_view name_or_id) const;

  // Views of every worker in the snapshot, in snapshot order.
  static void fill_views(const WorkerList& workers, std::vector<policy::WorkerView>& out);

 private:
  void notify_cordon(const Worker& w, bool cordoned, Origin by);
  mutable std::mutex mu_;
  std::shared_ptr<const WorkerList> workers_ = std::make_shared<WorkerList>();  // guarded by mu_
  std::uint64_t next_serial_ = 1;                                             // guarded by mu_
  std::vector<Listener> listeners_;                                           // guarded by mu_
};

}  // namespace kvroute::backends
