// ClientSession: one client connection of the API listener. It reads each request (bounded: --max-body-bytes,
// --client-idle-timeout, the shared --max-held-body-bytes budget, "100 Continue"), hands it to its
// RequestHandler, writes the answer, and then reads the next request (keep-alive) or closes (the client's
// wish, an error, or a drain). It watches for a client that disconnects while its request is being served.
// It knows nothing of workers: what a request means is the handler's business (router/api/).
//
// The connection is plain TCP or TLS (router/client_stream.h; a TLS handshake comes first, bounded by
// --header-read-timeout). A request head begun must be complete within --header-read-timeout, else the client
// gets 408 and the connection closes; a connection with no request begun is closed silently after
// --client-idle-timeout, as before.
//
// Threading: owned by its pending operations (shared_from_this); every handler runs on the single thread of
// its listener's io_context, so neither the session nor its handler needs a lock or a strand. A handler that
// waits on another thread (a worker's reply, a prefix hold's wake-up) posts back to executor() and keeps the
// session alive with keep().
//
//   auto session = std::make_shared<ClientSession>(std::move(socket), options);
//   session->run(std::make_unique<api::ApiHandler>(*session, services));
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/parser.hpp>

#include "router/client_stream.h"
#include "router/http_util.h"
#include "router/lazy_deadline.h"
#include "router/metrics.h"
#include "router/services.h"

namespace kvroute::router {

class ClientSession;

// What a ClientSession hands its requests to; one per connection, called on the session's thread.
class RequestHandler {
 public:
  virtual ~RequestHandler() = default;
  // A request has been read in full (ClientSession::request()): answer it once, with ClientSession::answer(),
  // or by relaying a response through socket() and then calling ClientSession::answered().
  virtual void on_request() = 0;
  // Whether a disconnect noticed now would end work under way (an exchange with a worker, a held request).
  virtual bool cancellable() const = 0;
  // The client disconnected while cancellable(): end that work and close the session.
  virtual void on_client_gone() = 0;
  // The request read last has been answered in full, or never will be (the connection closes). May run from
  // the session's destructor at shutdown, after the Services are gone: it must not reach them.
  virtual void on_request_end() = 0;
  // The connection is closing: cancel what waits on a timer.
  virtual void on_close() = 0;
};

class ClientSession : public std::enable_shared_from_this<ClientSession> {
 public:
  struct Options {
    std::uint64_t max_body_bytes = 0;
    double idle_timeout_s = 0;
    double header_timeout_s = 10;      // --header-read-timeout: a request head begun, and the TLS handshake
    std::shared_ptr<TlsContext> tls;   // null: plain TCP
    // Own shares: at shutdown a session outlives the Services (see Services::drain).
    std::shared_ptr<DrainState> drain;
    std::shared_ptr<BodyBudget> bodies;  // may be null: bodies are then not counted
    RouterMetrics* metrics = nullptr;    // kvroute_body_budget_waits_total
  };
  ClientSession(boost::asio::ip::tcp::socket&& socket, Options options);
  ~ClientSession();

  void run(std::unique_ptr<RequestHandler> handler);

  // ---- for the handler, while it serves a request ----
  const StringRequest& request() const { return req_; }
  // The request as it goes on to the worker: a handler may replace fields before forwarding (the client's API
  // key is never sent on).
  StringRequest& request_to_forward() { return req_; }
  const std::string& request_id() const { return request_id_; }
  // Writes a whole answer, then reads the next request or closes.
  void answer(std::shared_ptr<StringResponse> res);
  void answer_error(const Error& e) { answer(error_response(e)); }
  void answer_json(unsigned status, std::string body) { answer(json_response(status, std::move(body))); }
  // The answer has been relayed in full through socket(): reads the next request or closes.
  void answered();
  // Whether the connection closes after this answer (the client asked, or the daemon drains).
  bool close_after() const { return close_after_; }
  void set_close_after() { close_after_ = true; }
  bool draining() const { return drain_->draining; }
  // The status of this request's answer (0 until one is known); a relay sets it from the worker's head.
  unsigned status() const { return status_; }
  void set_status(unsigned status) { status_ = status; }
  // Starts watching for a disconnect (once per request; later calls are no-ops). A disconnect noticed while
  // the handler is cancellable() calls its on_client_gone().
  void watch_disconnect();
  void close();

  // The client's stream, for relaying a response (plain or TLS).
  ClientStream& socket() { return stream_; }
  boost::asio::any_io_executor executor() { return stream_.get_executor(); }
  std::shared_ptr<ClientSession> keep() { return shared_from_this(); }

 private:
  void on_handshake(boost::beast::error_code ec);
  void do_read();
  void read_request();
  bool reserve_body();
  void send_continue();
  void wait_for_body_budget();
  void on_client_bytes(boost::beast::error_code ec, std::size_t n);
  void on_idle();
  void on_head_due();
  void on_read(boost::beast::error_code ec);
  void arm_watch();
  void on_client_readable(std::uint64_t gen, boost::beast::error_code ec);
  void end_request();

  ClientStream stream_;
  Options opt_;
  std::shared_ptr<DrainState> drain_;  // opt_.drain, never null
  std::unique_ptr<RequestHandler> handler_;
  boost::beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  bool reading_ = false;             // a request is being read (the idle timeout applies)
  bool writing_ = false;             // an answer of the session's own is being written (the idle timeout applies)
  bool handshaking_ = false;         // the TLS handshake is under way (the header timeout applies)
  bool head_begun_ = false;          // a byte of this request's head came (the header timeout applies)
  bool continue_sent_ = false;       // "100 Continue" answered this request's Expect
  bool head_checked_ = false;        // check_request_head() has passed this request's head
  std::uint64_t body_reserved_ = 0;  // this request's share of --max-held-body-bytes (grows as its body is read)
  bool budget_waited_ = false;       // counted in kvroute_body_budget_waits_total
  std::optional<boost::asio::steady_timer> budget_timer_;
  LazyDeadline idle_;  // --client-idle-timeout
  LazyDeadline head_;  // --header-read-timeout
  StringRequest req_;
  std::string request_id_;
  bool close_after_ = false;
  unsigned status_ = 0;
  bool counted_ = false;  // this request is in DrainState::active
  std::uint64_t generation_ = 0;               // the request being served
  std::uint64_t watched_ = ~std::uint64_t{0};  // the generation whose client is watched
};

}  // namespace kvroute::router
