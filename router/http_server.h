// kvroute's HTTP front ends: the OpenAI-compatible API listener and the admin listener.
//
// One ApiSession per client connection, owned by its pending operations (shared_from_this) and running on
// the single thread of its listener's io_context. A routed request is parsed (bounded body), routed by Router,
// and relayed to the worker through a pooled keep-alive connection: the response head is sent as soon as the
// worker's arrives and the body is passed on piece by piece as it is read, never buffered whole, so
// server-sent events stream. When the client goes away mid-request the upstream connection is closed, which
// cancels the worker's request. A worker that refuses the connection is taken out of rotation and the
// request, not yet sent, routed again. --request-timeout bounds the whole exchange: a worker that has not
// answered by then gets the client a 504, and a response still streaming is cut. --client-idle-timeout bounds
// the reading of each request. While draining (DrainState) every response closes its connection.
//
//   Services svc{config, registry, router, pool, metrics, ...};
//   auto api = std::make_shared<Listener>(io, endpoint, svc, Listener::Kind::kApi);
//   api->run();
#pragma once

#include <atomic>
#include <functional>
#include <memory>

#include <boost/json/object.hpp>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>

#include "backends/upstream.h"
#include "backends/worker_registry.h"
#include "router/config.h"
#include "router/metrics.h"
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
};

class Listener : public std::enable_shared_from_this<Listener> {
 public:
  enum class Kind { kApi, kAdmin };
  Listener(boost::asio::io_context& io, Services& services, Kind kind);
  // Binds and listens; an error says which address failed and why. With reuse_port several listeners (one
  // per I/O thread) share the address and the kernel spreads connections over them.
  Result<bool> open(const boost::asio::ip::tcp::endpoint& endpoint, bool reuse_port);
  void run();
  void stop();
  boost::asio::ip::tcp::endpoint local_endpoint() const;

 private:
  void do_accept();
  // accept() failed for want of a file descriptor or memory: wait before the next try (the connection stays
  // queued in the kernel, so an immediate retry fails again at once, spinning a core and flooding the log).
  void accept_later(const boost::system::error_code& ec);
  boost::asio::io_context& io_;
  boost::asio::ip::tcp::acceptor acceptor_;
  boost::asio::steady_timer retry_;
  std::chrono::steady_clock::time_point warned_at_{};  // the last "accept:" warning; later ones are counted
  std::uint64_t unwarned_ = 0;
  Services& services_;
  Kind kind_;
};

// HOST:PORT to a TCP endpoint ("0.0.0.0:8080", "[::1]:9090", "localhost:80").
Result<boost::asio::ip::tcp::endpoint> resolve_listen(const std::string& host_port);

}  // namespace kvroute::router
