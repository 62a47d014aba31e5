#include "backends/upstream.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>

#include "net/resource_errors.h"

namespace kvroute::backends {

namespace http = beast::http;
using tcp = asio::ip::tcp;

void async_connect_endpoint(beast::tcp_stream& stream, const WorkerEndpoint& endpoint,
                            std::function<void(beast::error_code)> handler) {
  beast::error_code ec;
  auto addr = asio::ip::make_address(endpoint.host, ec);
  if (!ec) {
    tcp::endpoint ep(addr, static_cast<unsigned short>(std::stoul(endpoint.port)));
    stream.async_connect(ep, [handler = std::move(handler)](beast::error_code e) { handler(e); });
    return;
  }
  auto resolver = std::make_shared<tcp::resolver>(stream.get_executor());
  resolver->async_resolve(
      endpoint.host, endpoint.port,
      [resolver, &stream, handler = std::move(handler)](beast::error_code e, tcp::resolver::results_type r) mutable {
        if (e) return handler(e);
        stream.async_connect(r, [handler = std::move(handler)](beast::error_code e2, const tcp::endpoint&) {
          handler(e2);
        });
      });
}

UpstreamPool::UpstreamPool(asio::any_io_executor ex, Options options)
    : ex_(std::move(ex)), options_(options), state_(std::make_shared<State>(ex_)) {}

namespace {
// Pooled connections idle for at most this long are reused without the check below (see acquire()).
constexpr std::chrono::seconds kUncheckedIdle{1};

// A pooled connection the peer closed while idle reads as EOF at once; drop those before reuse.
// One recv(MSG_PEEK | MSG_DONTWAIT) on the native socket: toggling the socket's non-blocking mode around
// the peek cost two more system calls (ioctl) on every request.
bool looks_alive(beast::tcp_stream& s) {
  auto& sock = s.socket();
  if (!sock.is_open()) return false;
  char byte;
  const ssize_t n = ::recv(sock.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);  // data or EOF on an idle HTTP connection: unusable
}
}  // namespace

void UpstreamPool::acquire(const Worker& worker, Handler handler, bool fresh_only) {
  const WorkerId id = worker.id();
  const std::uint64_t serial = worker.serial();
  if (!fresh_only) {
    std::unique_lock lock(state_->mu);
    auto& idle = state_->idle[id];
    const auto now = std::chrono::steady_clock::now();
    while (!idle.empty()) {
      Idle conn = std::move(idle.back());
      idle.pop_back();
      const auto idle_for = now - conn.since;
      if (idle_for > options_.idle_timeout) continue;
      // Released after its worker was removed and the id given to another: it leads to the old address.
      if (conn.serial != serial) continue;
      // A connection that answered within the last second is not checked: servers close idle keep-alive
      // connections after seconds (uvicorn's default is 5 s), and a request that still finds one closed is
      // retried once on a fresh connection by the caller. The check is one system call per request.
      if (idle_for > kUncheckedIdle && !looks_alive(*conn.stream)) continue;
      lock.unlock();
      handler({}, Lease{id, serial, std::move(conn.stream), true});
      return;
    }
  }
  auto stream = std::make_shared<beast::tcp_stream>(ex_);
  stream->expires_after(options_.connect_timeout);
  auto* raw = stream.get();
  async_connect_endpoint(*raw, worker.endpoint(),
                         [id, serial, stream, handler = std::move(handler)](beast::error_code ec) mutable {
                           stream->expires_never();
                           if (ec) stream.reset();
                           Lease lease{id, serial, std::move(stream), false};
                           handler(ec, std::move(lease));
                         });
}

void UpstreamPool::release(Lease lease, bool reusable) {
  if (!lease.stream) return;
  if (!reusable || !lease.stream->socket().is_open()) {
    beast::error_code ec;
    lease.stream->socket().shutdown(tcp::socket::shutdown_both, ec);
    lease.stream->socket().close(ec);
    return;
  }
  lease.stream->expires_never();
  std::lock_guard lock(state_->mu);
  auto& idle = state_->idle[lease.worker];
  if (idle.size() >= options_.max_idle_per_worker) return;  // the stream closes as it goes out of scope
  idle.push_back(Idle{lease.serial, std::move(lease.stream), std::chrono::steady_clock::now()});
  if (!state_->sweeping) arm_sweep(state_, options_.idle_timeout);
}

namespace {
// How often idle connections are checked. A worker's close is noticed within it (plus kUncheckedIdle).
constexpr std::chrono::seconds kSweepEvery{1};
}  // namespace

void UpstreamPool::arm_sweep(const std::shared_ptr<State>& state, std::chrono::steady_clock::duration idle_timeout) {
  state->sweeping = true;
  state->sweep.expires_after(kSweepEvery);
  state->sweep.async_wait([weak = std::weak_ptr<State>(state), idle_timeout](beast::error_code ec) {
    const auto s = weak.lock();
    if (!s || ec) return;  // the pool is gone (its timer cancelled)
    sweep(s, idle_timeout);
  });
}

void UpstreamPool::sweep(const std::shared_ptr<State>& shared, std::chrono::steady_clock::duration idle_timeout) {
  State& state = *shared;
  std::vector<std::shared_ptr<beast::tcp_stream>> dead;  // closed outside the lock
  std::unique_lock lock(state.mu);
  const auto now = std::chrono::steady_clock::now();
  bool any = false;
  for (auto it = state.idle.begin(); it != state.idle.end();) {
    auto& idle = it->second;
    std::erase_if(idle, [&](Idle& c) {
      const auto idle_for = now - c.since;
      // Checked only past kUncheckedIdle: one system call each, and a connection that just answered is alive.
      const bool closed = idle_for > kUncheckedIdle && !looks_alive(*c.stream);
      if (!closed && idle_for <= idle_timeout) return false;
      state.reaped += closed ? 1 : 0;
      dead.push_back(std::move(c.stream));
      return true;
    });
    any = any || !idle.empty();
    it = idle.empty() ? state.idle.erase(it) : std::next(it);
  }
  state.sweeping = false;
  if (any) arm_sweep(shared, idle_timeout);  // only while connections idle: an idle pool sets no timer
  lock.unlock();
  for (auto& d : dead) {
    beast::error_code ignored;
    d->socket().shutdown(tcp::socket::shutdown_both, ignored);
    d->socket().close(ignored);
  }
}

void UpstreamPool::drop(WorkerId worker) {
  std::lock_guard lock(state_->mu);
  state_->idle.erase(worker);
}

std::size_t UpstreamPool::idle_count(WorkerId worker) const {
  std::lock_guard lock(state_->mu);
  auto it = state_->idle.find(worker);
  return it == state_->idle.end() ? 0 : it->second.size();
}

std::uint64_t UpstreamPool::reaped() const {
  std::lock_guard lock(state_->mu);
  return state_->reaped;
}

namespace {

class ControlRequest : public std::enable_shared_from_this<ControlRequest> {
 public:
  ControlRequest(asio::any_io_executor ex, const WorkerEndpoint& ep, http::verb method, std::string target, std::string body,
        std::chrono::milliseconds timeout, std::function<void(Result<SimpleResponse>)> handler, std::size_t body_limit,
        std::string_view authorization)
      : stream_(ex), endpoint_(ep), timeout_(timeout), handler_(std::move(handler)) {
    req_.method(method);
    req_.target(target);
    if (!authorization.empty()) req_.set(http::field::authorization, authorization);
    if (method == http::verb::post) {
      req_.set(http::field::content_type, "application/json");
      req_.body() = std::move(body);
      req_.prepare_payload();
    }
    req_.version(11);
    req_.set(http::field::host, ep.name);
    req_.set(http::field::user_agent, "kvroute");
    req_.set(http::field::connection, "close");
    parser_.body_limit(body_limit);
  }

  void start() {
    stream_.expires_after(timeout_);
    async_connect_endpoint(stream_, endpoint_, [self = shared_from_this()](beast::error_code ec) {
      if (ec) return self->finish(ec, "connect");
      http::async_write(self->stream_, self->req_, [self](beast::error_code ec2, std::size_t) {
        if (ec2) return self->finish(ec2, "write");
        http::async_read(self->stream_, self->buffer_, self->parser_, [self](beast::error_code ec3, std::size_t) {
          if (ec3) return self->finish(ec3, "read");
          self->finish({}, "");
        });
      });
    });
  }

 private:
  void finish(beast::error_code ec, const char* what) {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
    if (ec) {
      const std::string msg = ec == beast::error::timeout ? "timed out" : ec.message();
      const bool local = net::local_resource_error(ec);
      handler_(make_error(endpoint_.name + ": " + what + ": " + msg, local ? 503 : 502,
                          local ? "service_unavailable" : "upstream_error", local ? kLocalResourcesCode : ""));
      return;
    }
    auto& res = parser_.get();
    handler_(SimpleResponse{res.result_int(), std::move(res.body()), std::string(res[http::field::content_type])});
  }

  beast::tcp_stream stream_;
  WorkerEndpoint endpoint_;
  std::chrono::milliseconds timeout_;
  std::function<void(Result<SimpleResponse>)> handler_;
  http::request<http::string_body> req_;
  beast::flat_buffer buffer_;
  http::response_parser<http::string_body> parser_;
};

}  // namespace

void http_get(asio::any_io_executor ex, const WorkerEndpoint& endpoint, std::string target,
              std::chrono::milliseconds timeout, std::function<void(Result<SimpleResponse>)> handler,
              std::size_t body_limit, std::string_view authorization) {
  std::make_shared<ControlRequest>(std::move(ex), endpoint, http::verb::get, std::move(target), std::string(), timeout,
                         std::move(handler), body_limit, authorization)
      ->start();
}

void http_post(asio::any_io_executor ex, const WorkerEndpoint& endpoint, std::string target, std::string json_body,
               std::chrono::milliseconds timeout, std::function<void(Result<SimpleResponse>)> handler,
               std::size_t body_limit, std::string_view authorization) {
  std::make_shared<ControlRequest>(std::move(ex), endpoint, http::verb::post, std::move(target), std::move(json_body), timeout,
                         std::move(handler), body_limit, authorization)
      ->start();
}

}  // namespace kvroute::backends
