// Listener: accepts TCP connections on one address and hands each one to a session factory (the API listener
// makes a ClientSession with an api::ApiHandler, the admin listener an admin::AdminSession).
//
// Runs on one io_context, run by exactly one thread (router/app.h): the sessions it makes run there too. Out of
// file descriptors it waits and retries instead of spinning, and warns at most every 10 s.
//
//   auto l = std::make_shared<Listener>(io, metrics, [&](tcp::socket s) { start_session(std::move(s)); });
//   if (auto ok = l->open(endpoint, /*reuse_port=*/false); !ok) fail(ok.error().message);
//   l->run();
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>

#include "router/metrics.h"
#include "util/result.h"

namespace kvroute::router {

class Listener : public std::enable_shared_from_this<Listener> {
 public:
  using SessionFactory = std::function<void(boost::asio::ip::tcp::socket&&)>;
  Listener(boost::asio::io_context& io, RouterMetrics& metrics, SessionFactory make_session);
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
  RouterMetrics& metrics_;
  SessionFactory make_session_;
};

// HOST:PORT to a TCP endpoint ("0.0.0.0:8080", "[::1]:9090", "localhost:80").
Result<boost::asio::ip::tcp::endpoint> resolve_listen(const std::string& host_port);

}  // namespace kvroute::router
