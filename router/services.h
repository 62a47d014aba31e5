// What the front ends of one I/O thread share: the daemon's components (Services), the drain state and the
// budget of request bodies held at once.
//
// App builds one Services per I/O thread (its own upstream pool and drain counter; the rest shared) and
// hands it to that thread's API sessions and, for the first thread, to the admin session.
//
//   Services svc{config, registry, router, pool, metrics, tokenize_cache, ...};
//   auto api = std::make_shared<Listener>(io, metrics, [&](tcp::socket s) { ... });
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <boost/json/object.hpp>

#include "backends/outlier_detector.h"
#include "backends/upstream.h"
#include "backends/worker_registry.h"
#include "router/admission.h"
#include "router/auth.h"
#include "router/config.h"
#include "router/metrics.h"
#include "router/retry_budget.h"
#include "router/router.h"
#include "router/tokenizer_client.h"

namespace kvroute::router {

// Graceful shutdown (App::begin_drain), one per I/O thread: while `draining`, the API listeners accept nothing,
// /ready answers 503 and every response closes its connection; `active` counts the thread's API requests read
// and not yet answered in full, which the daemon waits for (--drain-timeout).
struct DrainState {
  std::atomic<bool> draining{false};
  std::atomic<int> active{0};
};

// Bytes of request bodies the API sessions hold at once, over every I/O thread (--max-held-body-bytes). A
// session reserves its body as it reads it; one whose body would go beyond the limit reads nothing more until
// others finish (TCP holds its client back), so a burst of long prompts cannot run the router out of memory.
// A request alone always fits, whatever its size (within --max-body-bytes), so nothing waits forever.
struct BodyBudget {
  explicit BodyBudget(std::uint64_t limit) : limit(limit) {}
  // Adds `n` to what is held, unless others (all but the caller's `own` share) hold some and it would go
  // beyond the limit.
  bool try_reserve(std::uint64_t n, std::uint64_t own) {
    std::uint64_t now = held.load(std::memory_order_relaxed);
    do {
      if (now > own && now + n > limit) return false;
    } while (!held.compare_exchange_weak(now, now + n, std::memory_order_relaxed));
    return true;
  }
  void release(std::uint64_t n) { held.fetch_sub(n, std::memory_order_relaxed); }

  const std::uint64_t limit;
  std::atomic<std::uint64_t> held{0};
};

struct Services {
  const Config& config;
  backends::WorkerRegistry& registry;
  Router& router;
  backends::UpstreamPool& pool;
  RouterMetrics& metrics;
  TokenizeCache& tokenize_cache;
  // Adds a worker's KV event stream status to its /admin/workers entry (no-op without a stream).
  std::function<void(hashing::WorkerId, boost::json::object&)> describe_events;
  // Shared with the sessions: one still queued when the daemon exits is destroyed with its io_context, after
  // the App and these Services.
  std::shared_ptr<DrainState> drain;
  // A worker that could not be connected to: out of rotation until its health checks pass again.
  std::function<void(backends::Worker&, const std::string& why)> worker_unreachable;
  // Shared by every I/O thread's Services; outlives them like `drain`.
  std::shared_ptr<BodyBudget> bodies;
  // Reads the worker's /v1/models again now (after a LoRA adapter was loaded or unloaded through the router),
  // then calls the function given (on another thread).
  std::function<void(hashing::WorkerId, std::function<void()>)> refresh_models;
  // Shared by every I/O thread's Services, and held by the handlers (a slot may be released at shutdown, after
  // the Services are gone): --max-concurrent-requests (null: no cap), --api-keys-file (null: no key needed).
  std::shared_ptr<Admission> admission;
  std::shared_ptr<const ApiKeys> api_keys;
  // Failover, shared by every thread (docs/reliability.md, "Failures").
  backends::OutlierDetector* outliers = nullptr;
  RetryBudget* retries = nullptr;
  // A worker whose connection broke (reset, or a response cut off): its health is checked at once
  // (HealthChecker::check_now), so a crashed worker leaves rotation before its next scheduled check.
  std::function<void(backends::Worker&)> worker_broke;
};

}  // namespace kvroute::router
