// RelayObserver: what the router reads out of the bytes it relays from a worker to a client, for
// Router::complete() and the next requests: the first token (TTFT), the usage, a new stored response's id, the
// state of a background response, and the usage event the router asked for itself, which it removes.
//
// The exchange (router/exchange.h) feeds it the worker's head and each piece of body as it passes; the piece
// it relays is what on_body() returns. Nothing here touches a socket. One per client connection, reused by
// each exchange; used on the connection's thread only.
//
//   observer.begin(/*responses=*/false, parsed.strip_usage);
//   const bool rewritten = observer.on_head(200, /*event_stream=*/true, worker, request_id);
//   std::string_view out = observer.on_body(piece, last);   // relay `out`
//   outcome.usage = observer.usage();
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <boost/beast/http/verb.hpp>

#include "backends/worker_registry.h"
#include "router/router.h"
#include "router/usage.h"

namespace kvroute::router {

// Moves every complete event ("\n\n"-terminated) from `pending` to `out`, except a usage-only event (the extra
// event a router-requested include_usage produces), whose usage goes to `usage`. At the end of the stream
// whatever remains is passed on as it is.
void take_complete_events(std::string& pending, std::string& out, bool last, std::optional<Usage>& usage);

class RelayObserver {
 public:
  // `decision`: the routing decision of the request being relayed, when it was routed (empty for a route
  // passed through); owned by the caller, read and updated as the response passes.
  RelayObserver(Router& router, std::optional<Decision>& decision) : router_(router), decision_(decision) {}

  // The request being relayed asked for a stream (its routing decision says so; a route passed through: no).
  bool streamed() const { return decision_ && decision_->streamed; }
  // An exchange begins: nothing of an earlier one on this connection may be read as this one's usage.
  // `responses`: a Responses API request (its id is read); `strip_usage`: the router added include_usage.
  void begin(bool responses, bool strip_usage);
  // The worker's head. True when the body is rewritten (the usage event removed): its length changes.
  bool on_head(unsigned status, bool event_stream, const backends::Worker& worker, std::string_view request_id);
  // A piece of the body (`last`: the response ends with it); returns the bytes to relay.
  std::string_view on_body(std::string_view piece, bool last);
  // The usage the response reported: the usage event removed, else the response's end (a worker may put
  // usage in its last token event instead).
  std::optional<Usage> usage() const { return stream_usage_ ? stream_usage_ : find_usage(tail_); }

  // A poll, cancel or delete of a background response whose load the router holds: its answer may show that
  // the response has ended (Router::holds_background).
  void watch_background(const std::string& id, std::string_view suffix, boost::beast::http::verb method);
  // The watched exchange is over: a 2xx cancel or delete ends the response, and so does a poll answered with a
  // final status, or a 404 (the worker no longer has it: restarted, or it was deleted).
  void settle_background(bool ok, unsigned status);
  void end_background_watch();

 private:
  void capture_response_id(std::string_view piece);
  void keep_tail(std::string_view piece);
  void time_tokens(std::string_view piece);

  Router& router_;
  std::optional<Decision>& decision_;
  const backends::Worker* worker_ = nullptr;  // of the exchange under way
  std::string_view request_id_;               // likewise, for log lines
  bool responses_ = false;
  bool strip_usage_ = false;   // this request's usage event was added by the router
  bool strip_active_ = false;  // ... and the response is an event stream to remove it from
  unsigned status_ = 0;
  // Inter-token latency of a successful event stream: when its last data event came, and whether one did.
  bool time_events_ = false;
  bool event_seen_ = false;
  std::chrono::steady_clock::time_point last_event_at_;
  std::string tail_;
  bool capture_id_ = false;    // a Responses API response whose id has not been read yet
  bool id_in_events_ = false;  // ... streamed: the id is in the first event
  bool await_output_ = false;  // a Responses API stream before its first output event (no first byte yet)
  std::string id_head_;        // the response's first bytes, until its id is read
  std::string sse_;            // bytes of an incomplete event (strip mode)
  std::optional<Usage> stream_usage_;  // the usage of the removed event (strip mode)
  std::string out_;                    // events to send on (strip mode)
  // A background response the router holds load for, polled (its status read from the answer) or ended here.
  enum class BackgroundWatch : std::uint8_t { kNone, kPoll, kEnd };
  BackgroundWatch background_watch_ = BackgroundWatch::kNone;
  std::string background_id_;
  std::unique_ptr<ResponseStatusReader> status_reader_;
};

}  // namespace kvroute::router
