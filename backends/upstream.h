// Upstream connections to workers: a keep-alive HTTP/1.1 connection pool, and a one-shot GET for control
// traffic (health checks, /v1/models, /metrics).
//
// The pool hands out connected beast::tcp_streams built on the io_context's executor (not a strand), so any
// session may reuse any idle connection; callers bind their own strand to the handlers of operations they
// start on it. A connection goes back to the pool only after a complete response that allows keep-alive.
// While connections idle there, a sweep every second closes those the worker closed (uvicorn closes idle
// keep-alive connections after 5 s; its FIN leaves our end readable) and those idle past the pool's idle
// timeout, so no socket sits in CLOSE-WAIT until the next request would have found it dead. A sweep, not a
// wait armed on each idle connection: arming and cancelling one per request cost a fifth of the relay's
// throughput (a cancelled operation wakes the reactor), where the sweep costs nothing per request.
//
//   pool.acquire(*worker, bind_executor(strand, [](beast::error_code ec, UpstreamPool::Lease lease) {...}));
//   ... write request, read response ...
//   pool.release(std::move(lease), /*reusable=*/res.keep_alive());
//
//   http_get(ex, worker->endpoint(), "/health", 2s, [](Result<SimpleResponse> r) {...});
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/tcp_stream.hpp>

#include "backends/worker_registry.h"
#include "util/result.h"

namespace kvroute::backends {

namespace beast = boost::beast;
namespace asio = boost::asio;

class UpstreamPool {
 public:
  struct Options {
    std::chrono::milliseconds connect_timeout{2000};
    std::size_t max_idle_per_worker = 64;
    std::chrono::seconds idle_timeout{30};
  };

  struct Lease {
    WorkerId worker = 0;
    std::uint64_t serial = 0;  // Worker::serial(): a connection is only reused for the worker it was made for
    std::shared_ptr<beast::tcp_stream> stream;
    bool reused = false;  // came from the idle pool (a stale keep-alive connection may fail once)
  };
  using Handler = std::function<void(beast::error_code, Lease)>;

  UpstreamPool(asio::any_io_executor ex, Options options);

  // An idle connection to the worker, or a new one. The handler may run on any thread of the io_context:
  // callers post to their own strand.
  void acquire(const Worker& worker, Handler handler, bool fresh_only = false);
  // Returns a connection after a complete exchange; it is closed unless `reusable`.
  void release(Lease lease, bool reusable);
  // Closes every idle connection of a worker (worker removed or declared unhealthy).
  void drop(WorkerId worker);

  std::size_t idle_count(WorkerId worker) const;
  // Idle connections closed because their worker closed them (found by the sweep).
  std::uint64_t reaped() const;

 private:
  struct Idle {
    std::uint64_t serial = 0;
    std::shared_ptr<beast::tcp_stream> stream;
    std::chrono::steady_clock::time_point since;
  };
  // Shared with the sweep's pending timer, which may complete after the pool is gone.
  struct State {
    explicit State(const asio::any_io_executor& ex) : sweep(ex) {}
    mutable std::mutex mu;
    std::unordered_map<WorkerId, std::vector<Idle>> idle;  // guarded by mu
    std::uint64_t reaped = 0;                              // guarded by mu
    asio::steady_timer sweep;
    bool sweeping = false;  // guarded by mu: the sweep's timer is armed
  };
  // Arms the next sweep (with state.mu held).
  static void arm_sweep(const std::shared_ptr<State>& state, std::chrono::steady_clock::duration idle_timeout);
  // Closes the idle connections the worker closed, or that idled past `idle_timeout`.
  static void sweep(const std::shared_ptr<State>& state, std::chrono::steady_clock::duration idle_timeout);

  asio::any_io_executor ex_;
  Options options_;
  std::shared_ptr<State> state_;
};

// The Error::code of a control request (http_get) that failed with net::local_resource_error.
inline constexpr const char* kLocalResourcesCode = "local_resources";

struct SimpleResponse {
  unsigned status = 0;
  std::string body;
  std::string content_type;
};

// GET `target` from the worker on a fresh connection with an overall deadline. The body is capped at
// `body_limit` bytes. `authorization`, when not empty, is sent as the Authorization header (a worker started
// with an API key, as `vllm serve --api-key`, refuses /v1 routes without it). The handler runs on `ex`.
void http_get(asio::any_io_executor ex, const WorkerEndpoint& endpoint, std::string target,
              std::chrono::milliseconds timeout, std::function<void(Result<SimpleResponse>)> handler,
              std::size_t body_limit = 4 << 20, std::string_view authorization = {});
// POST a JSON body, likewise.
void http_post(asio::any_io_executor ex, const WorkerEndpoint& endpoint, std::string target, std::string json_body,
               std::chrono::milliseconds timeout, std::function<void(Result<SimpleResponse>)> handler,
               std::size_t body_limit = 16 << 20, std::string_view authorization = {});

// Connects a tcp_stream to host:port (numeric hosts skip the resolver) within the stream's expiry.
void async_connect_endpoint(beast::tcp_stream& stream, const WorkerEndpoint& endpoint,
                            std::function<void(beast::error_code)> handler);

}  // namespace kvroute::backends
