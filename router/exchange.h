// Exchange: one upstream exchange of a client's request with one worker. It takes a connection from the
// thread's pool, writes the request (its head rebuilt without hop-by-hop fields, its body whole), reads the
// worker's head, and relays the body to the client piece by piece as it is read (never buffered whole, so
// server-sent events stream event by event), through a RelayObserver. --request-timeout bounds it from the
// connection on: a worker that has not answered by then gets the client a 504, and a response still streaming
// is cut. A reused keep-alive connection that the worker closed while idle is retried once, fresh.
//
// It reports how it ended to its ExchangeEvents, and a failure says where it happened: before the first byte
// of the response reached the client (nothing was written: the request may go to another worker, and the
// client gets an error answer) or after (the head is out: the client only learns of it by the connection
// closing). One per client connection, reused by each of its requests, on the connection's thread.
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
  void on_watch_due();
  // `worker_fault`: counted as the worker's broken exchange (not when the handler gives up on connecting).
  void failed(std::string why, bool retry_fresh, unsigned status = 502, const char* code = "worker_unavailable",
              bool worker_fault = true);
  void count_failure(RouterMetrics::WorkerFailure failure);
  void broke_off(boost::beast::error_code ec);
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
  bool awaiting_head_ = false;  // the worker has not answered yet
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
