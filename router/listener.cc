#include "router/listener.h"

#include <sys/socket.h>

#include <boost/asio/ip/address.hpp>
#include <boost/asio/post.hpp>

#include "net/resource_errors.h"
#include "router/log.h"

namespace kvroute::router {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

Result<tcp::endpoint> resolve_listen(const std::string& host_port) {
  auto colon = host_port.rfind(':');
  if (colon == std::string::npos) return make_error("listen address '" + host_port + "' must be HOST:PORT");
  std::string host = host_port.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host == "localhost") host = "127.0.0.1";
  if (host.empty()) host = "0.0.0.0";
  unsigned long port = 0;
  try {
    port = std::stoul(host_port.substr(colon + 1));
  } catch (...) {
    return make_error("listen address '" + host_port + "': bad port");
  }
  if (port > 65535) return make_error("listen address '" + host_port + "': bad port");
  boost::system::error_code ec;
  auto addr = asio::ip::make_address(host, ec);
  if (ec) return make_error("listen address '" + host_port + "': '" + host + "' is not an IP address");
  return tcp::endpoint(addr, static_cast<unsigned short>(port));
}

Listener::Listener(asio::io_context& io, RouterMetrics& metrics, SessionFactory make_session)
    : io_(io), acceptor_(io), retry_(io), metrics_(metrics), make_session_(std::move(make_session)) {}

Result<bool> Listener::open(const tcp::endpoint& endpoint, bool reuse_port) {
  boost::system::error_code ec;
  acceptor_.open(endpoint.protocol(), ec);
  if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec && reuse_port) acceptor_.set_option(asio::detail::socket_option::boolean<SOL_SOCKET, SO_REUSEPORT>(true), ec);
  if (!ec) acceptor_.bind(endpoint, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return make_error("cannot listen on " + endpoint.address().to_string() + ":" + std::to_string(endpoint.port()) +
                      ": " + ec.message());
  }
  return true;
}

void Listener::run() { do_accept(); }

void Listener::stop() {
  asio::post(acceptor_.get_executor(), [self = shared_from_this()] {
    boost::system::error_code ec;
    self->acceptor_.close(ec);
    self->retry_.cancel();
  });
}

tcp::endpoint Listener::local_endpoint() const {
  boost::system::error_code ec;
  return acceptor_.local_endpoint(ec);
}

void Listener::do_accept() {
  // Each io_context is run by exactly one thread (router/app.h), so a session needs no strand: all its
  // handlers run on that thread.
  acceptor_.async_accept(io_, [self = shared_from_this()](boost::system::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted) return;
    if (!ec) {
      socket.set_option(tcp::no_delay(true), ec);
      self->make_session_(std::move(socket));
    } else if (net::local_resource_error(ec)) {
      return self->accept_later(ec);
    } else {
      LOG_WARN("accept: " << ec.message());
    }
    self->do_accept();
  });
}

void Listener::accept_later(const boost::system::error_code& ec) {
  metrics_.error("accept");
  ++unwarned_;
  const auto now = std::chrono::steady_clock::now();
  if (now - warned_at_ >= std::chrono::seconds(10)) {
    LOG_WARN("accept: " << ec.message() << " (" << unwarned_ << " failed accepts since the last warning)"
                        << "; new connections wait in the kernel's queue. Each request holds a client and a worker "
                           "connection: raise the open-files limit (ulimit -n)");
    warned_at_ = now;
    unwarned_ = 0;
  }
  retry_.expires_after(std::chrono::milliseconds(50));
  retry_.async_wait([self = shared_from_this()](boost::system::error_code wait_ec) {
    if (!wait_ec && self->acceptor_.is_open()) self->do_accept();
  });
}

}  // namespace kvroute::router
