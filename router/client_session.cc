#include "router/client_session.h"

#include "router/http_hygiene.h"

#include <sys/socket.h>

#include <cerrno>

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/bind_handler.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/write.hpp>

namespace kvroute::router {

namespace beast = boost::beast;
namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace {
constexpr std::size_t kClientReadChunk = 16 * 1024;
}  // namespace

ClientSession::ClientSession(tcp::socket&& socket, Options options)
    : stream_(std::move(socket), options.tls),
      opt_(std::move(options)),
      drain_(opt_.drain),
      idle_(stream_.get_executor(), [this] { on_idle(); }),
      head_(stream_.get_executor(), [this] { on_head_due(); }) {}

// A hold's watch needs no cleanup here: the hold timer keeps the session alive until the hold ends, and a watch
// left by one destroyed at shutdown only posts a wake-up that finds no session.
ClientSession::~ClientSession() { end_request(); }

void ClientSession::run(std::unique_ptr<RequestHandler> handler) {
  handler_ = std::move(handler);
  if (!stream_.tls()) {
    return asio::dispatch(stream_.get_executor(), beast::bind_front_handler(&ClientSession::do_read, shared_from_this()));
  }
  handshaking_ = true;
  head_.set(std::chrono::steady_clock::now() + seconds(opt_.header_timeout_s), weak_from_this());
  stream_.async_handshake(beast::bind_front_handler(&ClientSession::on_handshake, shared_from_this()));
}

// A client that fails the handshake (a plain HTTP request, an unknown CA) gets nothing: it cannot read an answer.
void ClientSession::on_handshake(beast::error_code ec) {
  handshaking_ = false;
  if (ec || !stream_.tcp().is_open()) {
    if (opt_.metrics && ec != asio::error::operation_aborted) opt_.metrics->error("tls_handshake");
    return close();
  }
  do_read();
}

// ---- reading requests ----
// A request is read with plain socket reads and parsed here (Beast's composed read costs several layers of
// handlers per request). --client-idle-timeout bounds the whole read, from do_read on.
void ClientSession::do_read() {
  end_request();
  continue_sent_ = false;
  head_checked_ = false;
  head_begun_ = false;
  parser_.emplace();
  parser_->header_limit(kHeaderLimit);
  parser_->body_limit(opt_.max_body_bytes);
  parser_->eager(true);
  reading_ = true;
  idle_.set(std::chrono::steady_clock::now() + seconds(opt_.idle_timeout_s), weak_from_this());
  read_request();
}

void ClientSession::read_request() {
  beast::error_code ec;
  while (buffer_.size() > 0 && !parser_->is_done()) {
    const std::size_t n = parser_->put(buffer_.data(), ec);
    buffer_.consume(n);
    if (ec == http::error::need_more) {
      ec = {};
      break;
    }
    if (ec || n == 0) break;
  }
  if (!ec && !head_begun_ && !parser_->is_header_done() && (buffer_.size() > 0 || parser_->got_some())) {
    // The head has begun: from now on --header-read-timeout bounds it (a LazyDeadline, no timer operation).
    head_begun_ = true;
    head_.set(std::chrono::steady_clock::now() + seconds(opt_.header_timeout_s), weak_from_this());
  }
  if (!ec && parser_->is_header_done() && !head_checked_) {
    // Framing Beast 1.81 accepts but RFC 9112 sections 6.1 and 6.3 do not (a smuggling vector): answered and
    // closed before a byte of the body is read.
    head_checked_ = true;
    if (auto bad = check_request_head(parser_->get().base())) {
      reading_ = false;
      close_after_ = true;
      return answer_error(*bad);
    }
  }
  if (!ec && parser_->is_header_done() && !reserve_body()) return wait_for_body_budget();
  if (ec || parser_->is_done()) return on_read(ec);
  if (parser_->is_header_done() && !continue_sent_ && parser_->get().version() >= 11 &&
      beast::iequals(parser_->get()[http::field::expect], "100-continue")) {
    return send_continue();
  }
  stream_.async_read_some(buffer_.prepare(kClientReadChunk),
                          beast::bind_front_handler(&ClientSession::on_client_bytes, shared_from_this()));
}

// The body bytes held, and one more read's worth while the body is still coming: what is received counts, not
// what a header declares (a client that declares 8 MB and sends nothing holds one read). False when
// --max-held-body-bytes are held by others.
bool ClientSession::reserve_body() {
  if (!opt_.bodies) return true;
  const std::uint64_t have = parser_->get().body().size();
  const std::uint64_t want = parser_->is_done() ? have : have + kClientReadChunk;
  if (want > body_reserved_) {
    if (!opt_.bodies->try_reserve(want - body_reserved_, body_reserved_)) return false;
    body_reserved_ = want;
  }
  return true;
}

// The client waits for this before it sends the body (curl does for bodies over 1 MB, for a second). A body
// over --max-body-bytes has failed the parse already: it gets its 413 instead.
void ClientSession::send_continue() {
  continue_sent_ = true;
  static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
  asio::async_write(stream_, asio::buffer(kContinue.data(), kContinue.size()),
                    [self = shared_from_this()](beast::error_code wec, std::size_t) {
                      if (wec) return self->on_read(wec);
                      self->read_request();
                    });
}

// --max-held-body-bytes are held: read nothing more of this request (its client is held back by TCP) and try
// again shortly. --client-idle-timeout still bounds the wait.
void ClientSession::wait_for_body_budget() {
  if (!budget_waited_) {
    budget_waited_ = true;
    if (opt_.metrics) opt_.metrics->body_budget_wait();
  }
  if (!budget_timer_) budget_timer_.emplace(stream_.get_executor());
  budget_timer_->expires_after(std::chrono::milliseconds(20));
  budget_timer_->async_wait([self = shared_from_this()](beast::error_code ec) {
    if (!ec && self->reading_ && self->stream_.tcp().is_open()) self->read_request();
  });
}

void ClientSession::on_client_bytes(beast::error_code ec, std::size_t n) {
  if (!reading_) return;  // answered meanwhile (408): the connection closes once the answer is out
  buffer_.commit(n);
  if (ec) return on_read(ec);
  read_request();
}

// --client-idle-timeout (a LazyDeadline: a request costs a clock read, not a timer operation) has passed: a
// read still under way, or an answer of the session's own still being written, closes the connection, and the
// pending operation then fails and ends the session. A keep-alive connection idle between requests closes
// silently: nothing was asked.
void ClientSession::on_idle() {
  if (stream_.tcp().is_open() && (reading_ || writing_)) close();
}

// --header-read-timeout has passed: a TLS handshake still under way closes the connection; a request head begun
// and not complete is answered 408 (RFC 9110 15.5.9) and the connection closes. A slow client cannot hold a
// connection with a trickle of header bytes for the whole idle timeout (nginx's client_header_timeout, 60 s
// by default, and Envoy's request_headers_timeout are the same guard).
void ClientSession::on_head_due() {
  if (!stream_.tcp().is_open()) return;
  if (handshaking_) return close();
  if (!reading_ || !head_begun_ || parser_->is_header_done()) return;
  reading_ = false;
  close_after_ = true;
  if (opt_.metrics) opt_.metrics->error("header_timeout");
  answer_error(make_error("the request head was not complete within --header-read-timeout (" +
                              fmt_seconds(opt_.header_timeout_s) + ")",
                          408, "invalid_request_error", "request_timeout"));
}

void ClientSession::on_read(beast::error_code ec) {
  reading_ = false;
  if (ec) {
    const auto failure = read_failure(ec, opt_.max_body_bytes);
    if (!failure) return close();
    close_after_ = true;
    return answer_error(*failure);
  }
  req_ = parser_->release();
  auto target = normalize_target(req_.target());  // "/v1/../admin/workers" never reaches a worker as sent
  if (!target) {
    close_after_ = true;
    return answer_error(target.error());
  }
  req_.target(*target);
  close_after_ = !req_.keep_alive() || drain_->draining;
  counted_ = true;
  ++drain_->active;
  ++generation_;
  status_ = 0;
  request_id_ = request_id_of(req_);
  handler_->on_request();
}

// ---- answering ----
void ClientSession::answer(std::shared_ptr<StringResponse> res) {
  status_ = res->result_int();
  prepare_answer(*res, request_id_, !close_after_);
  writing_ = true;
  idle_.set(std::chrono::steady_clock::now() + seconds(opt_.idle_timeout_s), weak_from_this());
  http::async_write(stream_, *res, [self = shared_from_this(), res](beast::error_code ec, std::size_t) {
    self->writing_ = false;
    if (ec || self->close_after_ || self->drain_->draining) return self->close();
    self->do_read();
  });
}

void ClientSession::answered() {
  if (close_after_ || drain_->draining) return close();
  do_read();
}

// ---- noticing a disconnect ----
void ClientSession::watch_disconnect() {
  if (watched_ == generation_) return;
  watched_ = generation_;
  arm_watch();
}

void ClientSession::arm_watch() {
  stream_.tcp().async_wait(tcp::socket::wait_read, beast::bind_front_handler(&ClientSession::on_client_readable,
                                                                             shared_from_this(), generation_));
}

void ClientSession::on_client_readable(std::uint64_t gen, beast::error_code ec) {
  if (ec || gen != generation_) return;
  if (!handler_->cancellable()) {
    // Readable between a hold's end and the connection to the worker: the exchange watches again once it runs.
    watched_ = ~std::uint64_t{0};
    return;
  }
  beast::error_code e2;
  if (stream_.tcp().available(e2) > 0) return;  // a pipelined request, not a disconnect
  char byte;  // MSG_DONTWAIT rather than toggling the socket's mode: one system call, not three
  const ssize_t n = ::recv(stream_.tcp().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return arm_watch();  // spurious
  if (n > 0) return;                                               // data arrived meanwhile: pipelining
  handler_->on_client_gone();                                      // end of stream or a reset
}

// ---- ending ----
// The request read last has been answered in full, or will not be: it no longer holds up a drain.
void ClientSession::end_request() {
  if (body_reserved_ > 0) {
    opt_.bodies->release(body_reserved_);
    body_reserved_ = 0;
  }
  budget_waited_ = false;
  if (!counted_) return;
  counted_ = false;
  --drain_->active;
  if (handler_) handler_->on_request_end();
}

void ClientSession::close() {
  end_request();
  stream_.close();
  idle_.cancel();
  head_.cancel();
  if (handler_) handler_->on_close();
}

}  // namespace kvroute::router
