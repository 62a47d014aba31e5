#include "router/admin/admin_session.h"

#include <boost/asio/dispatch.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/bind_handler.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/write.hpp>

#include "router/admin/admin_api.h"

namespace kvroute::router::admin {

namespace beast = boost::beast;
namespace asio = boost::asio;
using tcp = asio::ip::tcp;

AdminSession::AdminSession(tcp::socket&& socket, Services& svc, std::shared_ptr<TlsContext> tls)
    : stream_(std::move(socket), tls),
      deadline_(stream_.get_executor()),
      svc_(svc),
      drain_(svc.drain),
      max_body_bytes_(svc.config.max_body_bytes),
      idle_timeout_s_(svc.config.client_idle_timeout_s),
      header_timeout_s_(svc.config.header_timeout_s),
      auth_(svc.config.admin_token) {}

void AdminSession::run() {
  expires_after(header_timeout_s_);
  stream_.async_handshake([self = shared_from_this()](beast::error_code ec) {
    if (ec) return self->close();
    self->do_read();
  });
}

// The admin API is for the operator: a timer operation per request costs nothing here.
void AdminSession::expires_after(double s) {
  deadline_.expires_after(seconds(s));
  deadline_.async_wait([weak = weak_from_this()](beast::error_code ec) {
    if (ec) return;
    if (auto self = weak.lock()) self->close();
  });
}

// The head first, so that a client waiting on "Expect: 100-continue" is told to send its body.
void AdminSession::do_read() {
  parser_.emplace();
  parser_->header_limit(kHeaderLimit);
  parser_->body_limit(max_body_bytes_);
  expires_after(idle_timeout_s_);
  http::async_read_header(stream_, buffer_, *parser_,
                          [self = shared_from_this()](beast::error_code ec, std::size_t) { self->on_header(ec); });
}

void AdminSession::on_header(beast::error_code ec) {
  if (ec) return on_read(ec);
  if (parser_->get().version() < 11 || !beast::iequals(parser_->get()[http::field::expect], "100-continue")) {
    return read_body();
  }
  static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
  asio::async_write(stream_, asio::buffer(kContinue.data(), kContinue.size()),
                    [self = shared_from_this()](beast::error_code wec, std::size_t) {
                      if (wec) return self->on_read(wec);
                      self->read_body();
                    });
}

void AdminSession::read_body() {
  expires_after(idle_timeout_s_);
  http::async_read(stream_, buffer_, *parser_,
                   [self = shared_from_this()](beast::error_code ec, std::size_t) { self->on_read(ec); });
}

void AdminSession::on_read(beast::error_code ec) {
  if (ec) {
    const auto failure = read_failure(ec, max_body_bytes_);
    if (!failure) return close();
    close_after_ = true;
    return answer(error_response(*failure));
  }
  req_ = parser_->release();
  close_after_ = !req_.keep_alive() || drain_->draining;
  request_id_ = request_id_of(req_);
  // Probes and Prometheus read /health, /ready and /metrics without a token; everything else (which can add a
  // worker and so redirect client traffic) needs --admin-token when one is set.
  const std::string_view path = target_path(req_.target());
  if (path != "/metrics" && path != "/health" && path != "/ready") {
    if (auto denied = auth_.check(req_[http::field::authorization])) {
      auto res = error_response(*denied);
      res->set(http::field::www_authenticate, "Bearer");
      return answer(res);
    }
  }
  answer(serve(req_, svc_));
}

void AdminSession::answer(std::shared_ptr<StringResponse> res) {
  prepare_answer(*res, request_id_, !close_after_);
  expires_after(idle_timeout_s_);
  http::async_write(stream_, *res, [self = shared_from_this(), res](beast::error_code ec, std::size_t) {
    if (ec || self->close_after_ || self->drain_->draining) return self->close();
    self->do_read();
  });
}

void AdminSession::close() {
  deadline_.cancel();
  stream_.close();
}

}  // namespace kvroute::router::admin
