// AdminSession: one connection to the admin listener (--admin-listen). The textbook Beast session: read a
// bounded request (--max-body-bytes, --client-idle-timeout for the read and for the write of its answer),
// answer it with admin::serve() (router/admin/admin_api.h), then read the next one or close (the client's wish,
// an error, or a drain). Admin requests are not counted in the drain, not logged in the access log and not
// charged to the body budget: the admin API is for the operator, and answers at once.
//
// The connection is plain TCP or TLS (--admin-tls-cert, router/client_stream.h); the TLS handshake is bounded
// by --header-read-timeout.
//
// Owned by its pending operations (shared_from_this), on the control-plane thread (the first io_context).
//
//   std::make_shared<admin::AdminSession>(std::move(socket), services)->run();
#pragma once

#include <memory>
#include <optional>
#include <string>

#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/http/parser.hpp>

#include "router/auth.h"
#include "router/client_stream.h"
#include "router/http_util.h"
#include "router/services.h"

namespace kvroute::router::admin {

class AdminSession : public std::enable_shared_from_this<AdminSession> {
 public:
  AdminSession(boost::asio::ip::tcp::socket&& socket, Services& svc, std::shared_ptr<TlsContext> tls);
  void run();

 private:
  void expires_after(double seconds);
  void do_read();
  void on_header(boost::beast::error_code ec);
  void read_body();
  void on_read(boost::beast::error_code ec);
  void answer(std::shared_ptr<StringResponse> res);
  void close();

  ClientStream stream_;
  boost::asio::steady_timer deadline_;  // of the operation under way: it closes the connection
  Services& svc_;
  std::shared_ptr<DrainState> drain_;  // the session may outlive svc_ (see Services::drain)
  const std::uint64_t max_body_bytes_;
  const double idle_timeout_s_;
  const double header_timeout_s_;
  const AdminAuth auth_;  // --admin-token; empty: open
  boost::beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  StringRequest req_;
  std::string request_id_;
  bool close_after_ = false;
};

}  // namespace kvroute::router::admin
