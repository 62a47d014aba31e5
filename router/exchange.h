// Exchange: one upstream exchange of a client's request with one worker. It takes a connection from the
// thread's pool, writes the request (its head rebuilt without hop-by-hop fields, its body whole), reads the
// worker's head, and relays the body to the client piece by piece as it is read (never buffered whole, so
// server-sent events stream event by event), through a RelayObserver. --request-timeout bounds it from the
// connection on: a worker that has not answered by then gets the client a 504, and a response still streaming
// is cut. --first-byte-timeout bounds a streamed request's wait for the worker's head. A reused keep-alive
// connection that the worker closed while idle is retried once, fresh.
//
// Every worker's outcome goes to the outlier detector (backends/outlier_detector.h): an answer below 500 is a
// success; a refused or broken connection, a 5xx, or a timeout a failure. A 502, 503 or 504 answer is not
// relayed when the handler would send the request elsewhere (ExchangeEvents::may_retry()): it ends as a
// retryable failure before the first byte. A server-sent event stream cut after its first byte ends with an
// error event in OpenAI's error shape (and no [DONE]) before its connection closes.
//
// It reports how it ended to its ExchangeEvents, and a failure says where it happened: before the first byte
// of the response reached the client (nothing was written: the request may go to another worker, and the
// client gets an error answer) or after (the head is out: an event stream ends with an error event, anything
// else with the connection). One per client connection, reused by each of its requests, on the connection's thread.
//
//   exchange.start(worker, body);   // its end comes as an ExchangeEvents call; none after release()
//   ... on_relayed(reusable):       exchange.release(reusable);
#pragma once

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/parser.hpp>

#include "router/client_session.h"
#include "router/lazy_deadline.h"
#include "router/metrics.h"
#include "router/relay_observer.h"
#include "router/services.h"

namespace kvroute::router {

// Where an exchange failed. Only a failure before the first byte leaves the client's answer unwritten, so
// only such a request can be tried again.
enum class FailedAt : std::uint8_t { kBeforeFirstByte, kAfterFirstByte };

struct ExchangeFailure {
  FailedAt where = FailedAt::kBeforeFirstByte;
  std::string why;  // for the client's error answer and the log
  unsigned status = 502;                 // the client's answer (kBeforeFirstByte)
  const char* code = "worker_unavailable";
  // The worker failed the request before any byte reached the client (a reset, a 502/503/504, a first-byte
  // timeout): another worker may be tried. Not for --request-timeout, nor the router's own resources.
  bool retryable = false;
  RouterMetrics::RetryKind kind = RouterMetrics::RetryKind::kBroken;
  // kAfterFirstByte: the response still ended well framed (a chunked event stream ended by its error event), so
  // the client's connection may serve its next request.
  bool ended_whole = false;
};

class ExchangeEvents {
 public:
  virtual ~ExchangeEvents() = default;
  // The worker could not be connected to: nothing was sent. The handler routes again or calls
  // Exchange::fail().
  virtual void on_connect_failed(boost::beast::error_code ec) = 0;
  virtual void on_exchange_failed(const ExchangeFailure& failure) = 0;
  // The response was relayed in full; `reusable`: the worker's connection may serve another exchange.
  virtual void on_relayed(bool reusable) = 0;
  // Writing to the client failed: it went away (the handler cancels the exchange).
  virtual void on_client_write_failed() = 0;
  // Asked when a worker answers 502, 503 or 504: whether the handler would send the request to another worker
  // (the answer is then dropped, and on_exchange_failed() says so with `retryable`).
  virtual bool may_retry() { return false; }
};

class Exchange {
 public:
  Exchange(ClientSession& client, Services& svc, RelayObserver& observer, ExchangeEvents& events);

  // Sends the client's request to `worker`, with `body` instead of the request's own when not empty.
  void start(std::shared_ptr<backends::Worker> worker, std::string_view body);
  // An exchange holds a worker connection (connected, not yet ended).
  bool active() const { return lease_.stream != nullptr; }
  // Ends the exchange as failed before its first byte (after on_connect_failed): on_exchange_failed follows.
  void fail(std::string why, unsigned status = 502, const char* code = "worker_unavailable");
  // Closes the worker connection at once (the worker sees it close and cancels the request); the operations
  // still under way complete into nothing.
  void cancel();
  // Gives the connection back to the pool (closed unless `reusable`); the exchange is over.
  void release(bool reusable);
  void cancel_timers();
  // A retry (router/retry_budget.h) rides on this exchange: its place in the budget is given back when the
  // exchange ends.
  void hold_retry(RetryBudget::Ticket ticket) { retry_ticket_ = std::move(ticket); }

 private:
  void build_request_head(std::string_view body);
  void acquire(bool fresh_only);
  void on_connect(boost::beast::error_code ec, backends::UpstreamPool::Lease lease);
  void on_request_written(boost::beast::error_code ec, std::size_t);
  void new_parser();
  void read_head();
  void on_head_bytes(boost::beast::error_code ec, std::size_t n);
  void on_head();
  bool build_response_head(bool rewritten);
  std::size_t parse_buffered(boost::beast::error_code& ec);
  void read_body();
  void on_body_bytes(boost::beast::error_code ec, std::size_t n);
  void read_upstream(void (Exchange::*next)(boost::beast::error_code, std::size_t));
  void relay_piece(std::size_t got, bool last);
  void write_down(const char* data, std::size_t size, bool last);
  void on_down_written(boost::beast::error_code ec, std::size_t);
  void on_deadline();
  void on_first_byte_due();
  void on_watch_due();
  // `worker_fault`: the worker's failure (outlier detection), and a broken exchange in the worker's error counts
  // unless `counted` already (a 5xx); not when the handler gives up on connecting.
  void failed(ExchangeFailure failure, bool retry_fresh, bool worker_fault = true, bool counted = false);
  void count_failure(RouterMetrics::WorkerFailure failure);
  void outlier(bool ok);
  void broken();
  void broke_off(boost::beast::error_code ec);
  void write_error_event(std::string why);
  void close_upstream();

  static constexpr std::size_t kRelayChunk = 16 * 1024;

  ClientSession& client_;
  Services& svc_;
  RelayObserver& observer_;
  ExchangeEvents& events_;
  std::shared_ptr<backends::Worker> worker_;
  std::string up_head_;            // start line and fields of the request to the worker
  std::string_view up_body_view_;  // its body
  backends::UpstreamPool::Lease lease_;
  std::shared_ptr<boost::beast::tcp_stream> orphan_;  // the upstream connection cancel() closed
  LazyDeadline deadline_;  // --request-timeout
  LazyDeadline watch_;     // kWatchClientAfter
  LazyDeadline first_byte_;  // --first-byte-timeout for streamed requests, --health-interval for the others
  RetryBudget::Ticket retry_ticket_;
  bool awaiting_head_ = false;  // the worker has not answered yet
  bool event_stream_ = false;   // the response is server-sent events
  bool down_writing_ = false;   // a write to the client is under way
  std::string cut_event_;       // the error event ending a cut stream (written only then)
  bool retried_ = false;
  boost::beast::flat_buffer up_buffer_;
  std::optional<http::response_parser<http::buffer_body>> up_parser_;
  std::string down_head_;      // status line and fields of the response to the client
  bool head_pending_ = false;  // down_head_ has not been written yet
  bool down_chunked_ = false;  // the client's response is chunk-framed by the relay
  bool down_last_ = false;     // the write under way ends the response
  std::array<char, 24> chunk_line_{};
  std::array<char, kRelayChunk> relay_{};
};

}  // namespace kvroute::router
