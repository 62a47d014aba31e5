#include "router/exchange.h"
#include "router/http_hygiene.h"
#include "net/resource_errors.h"
#include "router/request.h"

#include <cstdio>

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/string.hpp>

namespace kvroute::router {

namespace beast = boost::beast;
namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace {
// How long an exchange runs before the router watches its client for a disconnect. Each wait costs a system
// call (the reactor re-arms the socket), a seventh of all a short relayed request makes; a client that leaves
// sooner is noticed that much later, or when its response is written.
constexpr auto kWatchClientAfter = std::chrono::milliseconds(200);
// The error code of a response cut after its first byte: in the stream's error event and the access log.
constexpr const char* kStreamCut = "stream_interrupted";
}  // namespace

Exchange::Exchange(ClientSession& client, Services& svc, RelayObserver& observer, ExchangeEvents& events)
    : client_(client),
      svc_(svc),
      observer_(observer),
      events_(events),
      deadline_(client.executor(), [this] { on_deadline(); }),
      watch_(client.executor(), [this] { on_watch_due(); }),
      first_byte_(client.executor(), [this] { on_first_byte_due(); }) {}

void Exchange::start(std::shared_ptr<backends::Worker> worker, std::string_view body) {
  worker_ = std::move(worker);
  build_request_head(body);
  acquire(false);
}

// HTTP/1.1 to the worker: keep-alive by default, the body re-framed by its length.
void Exchange::build_request_head(std::string_view body) {
  const StringRequest& req = client_.request();
  if (body.empty()) body = req.body();
  up_head_.clear();
  up_head_.append(req.method_string());
  up_head_.push_back(' ');
  up_head_.append(req.target());
  up_head_.append(" HTTP/1.1\r\n");
  // Hop-by-hop fields, and every field the client's Connection header names, stay on this hop (RFC 9110
  // section 7.6.1); hop_by_hop() also drops the framing fields, which are written anew below.
  const HopByHopFilter named(req.base());
  for (const auto& f : req) {
    if (!hop_by_hop(f.name(), f.name_string()) && !named(f.name_string()) &&
        !beast::iequals(f.name_string(), "x-request-id")) {
      append_field(up_head_, f.name_string(), f.value());
    }
  }
  append_field(up_head_, "Host", worker_->endpoint().name);
  append_field(up_head_, "x-request-id", client_.request_id());
  append_field(up_head_, "Content-Length", std::to_string(body.size()));
  up_head_.append("\r\n");
  up_body_view_ = body;
}

void Exchange::acquire(bool fresh_only) {
  svc_.pool.acquire(
      *worker_,
      [this, keep = client_.keep()](beast::error_code ec, backends::UpstreamPool::Lease l) {
        // An idle pooled connection is handed over inline (same thread): dispatch runs it at once.
        asio::dispatch(client_.executor(),
                       [this, keep, ec, l = std::move(l)]() mutable { on_connect(ec, std::move(l)); });
      },
      fresh_only);
}

void Exchange::on_connect(beast::error_code ec, backends::UpstreamPool::Lease lease) {
  if (ec) {
    if (!net::local_resource_error(ec)) outlier(false);  // out of descriptors here, no worker is to blame
    return events_.on_connect_failed(ec);
  }
  lease_ = std::move(lease);
  // The exchange runs on the plain sockets (tcp_stream arms its timer on every operation): --request-timeout
  // holds for the whole exchange, from here to the end of the relayed body.
  awaiting_head_ = true;
  const auto now = std::chrono::steady_clock::now();
  deadline_.set(now + seconds(svc_.config.request_timeout_s), client_.weak_from_this());
  watch_.set(now + kWatchClientAfter, client_.weak_from_this());
  // A stream's head comes before its first token (vLLM, SGLang), so its wait is bounded well below the whole
  // exchange's. A whole (unstreamed) answer comes only after the last token, so no such bound fits it; its wait
  // looks at the worker every --health-interval instead (on_first_byte_due).
  first_byte_.set(now + seconds(observer_.streamed() ? svc_.config.first_byte_timeout_s : svc_.config.health_interval_s),
                  client_.weak_from_this());
  Pieces out;
  out.add(up_head_.data(), up_head_.size());
  out.add(up_body_view_.data(), up_body_view_.size());
  asio::async_write(lease_.stream->socket(), out,
                    asio::bind_executor(client_.executor(), [this, keep = client_.keep()](beast::error_code e,
                                                                                          std::size_t n) {
                      on_request_written(e, n);
                    }));
}

// The exchange's handlers return at once when cancel() ended it (no lease) while their operation was already
// queued.
void Exchange::on_request_written(beast::error_code ec, std::size_t) {
  if (!lease_.stream) return;
  if (ec) return failed({FailedAt::kBeforeFirstByte, "sending to worker " + worker_->name() + ": " + ec.message()}, lease_.reused);
  up_buffer_.clear();
  new_parser();
  read_head();
}

void Exchange::new_parser() {
  up_parser_.emplace();
  up_parser_->body_limit(boost::none);
  up_parser_->header_limit(kHeaderLimit);
}

// Reads until the worker's head is complete; body bytes that came with it stay in up_buffer_.
void Exchange::read_head() {
  beast::error_code ec;
  if (up_buffer_.size() > 0) {
    const std::size_t n = up_parser_->put(up_buffer_.data(), ec);
    up_buffer_.consume(n);
    if (ec == http::error::need_more) ec = {};
  }
  if (ec) return failed({FailedAt::kBeforeFirstByte, "reading from worker " + worker_->name() + ": " + ec.message()}, false);
  if (up_parser_->is_header_done()) {
    // An interim response (100 Continue, 103 Early Hints) precedes the real one: skip it.
    const unsigned status = up_parser_->get().result_int();
    if (status >= 100 && status < 200 && status != 101) {
      new_parser();
      return read_head();
    }
    return on_head();
  }
  read_upstream(&Exchange::on_head_bytes);
}

void Exchange::on_head_bytes(beast::error_code ec, std::size_t n) {
  if (!lease_.stream) return;
  up_buffer_.commit(n);
  // A reused keep-alive connection the worker closed while idle ends at once: retried once, fresh.
  if (ec) return failed({FailedAt::kBeforeFirstByte, "reading from worker " + worker_->name() + ": " + ec.message()}, lease_.reused);
  read_head();
}

void Exchange::on_head() {
  awaiting_head_ = false;
  auto& up = up_parser_->get();
  const unsigned status = up.result_int();
  // A 4xx is the client's request refused (kind worker_rejected), never an upstream error.
  if (!worker_->removed()) svc_.metrics.upstream_status(worker_->id(), status);
  outlier(status < 500);
  // A worker that cannot serve the request now (502, 503, 504): nothing has reached the client, so another
  // worker may serve it. The connection closes (its body is not read).
  if ((status == 502 || status == 503 || status == 504) && events_.may_retry()) {
    return failed({FailedAt::kBeforeFirstByte, "worker " + worker_->name() + " answered " + std::to_string(status),
                   status, "worker_unavailable", true, RouterMetrics::RetryKind::kStatus},
                  false, /*worker_fault=*/true, /*counted=*/true);
  }
  // The retry this exchange carried has its answer: its place in the budget is free (router/retry_budget.h).
  retry_ticket_.reset();
  client_.set_status(status);
  event_stream_ = up[http::field::content_type].find("text/event-stream") != std::string_view::npos;
  const bool rewritten = observer_.on_head(status, event_stream_, *worker_, client_.request_id());
  down_chunked_ = build_response_head(rewritten);
  head_pending_ = true;
  down_last_ = false;
  // Eager: one read passes on every chunk it brought (an SSE stream is a chunk per event), not one chunk.
  up_parser_->eager(true);
  // Body bytes that came with the head go out with it in one write; otherwise the head goes out alone now.
  if (up_buffer_.size() > 0 || up_parser_->is_done()) {
    beast::error_code perr;
    const std::size_t got = parse_buffered(perr);
    if (perr) return failed({FailedAt::kBeforeFirstByte, "reading from worker " + worker_->name() + ": " + perr.message()}, false);
    if (got > 0 || up_parser_->is_done()) return relay_piece(got, up_parser_->is_done());
  }
  write_down(nullptr, 0, false);
}

// The client's head: the worker's, less the hop-by-hop fields, framed for the client. Returns whether the
// relay chunk-frames the body.
bool Exchange::build_response_head(bool rewritten) {
  auto& up = up_parser_->get();
  const unsigned status = up.result_int();
  down_head_.clear();
  down_head_.append("HTTP/1.1 ");
  down_head_.append(std::to_string(status));
  down_head_.push_back(' ');
  down_head_.append(up.reason().empty() ? http::obsolete_reason(up.result()) : up.reason());
  down_head_.append("\r\n");
  for (const auto& f : up) {
    const std::string_view name = f.name_string();
    if (hop_by_hop(f.name(), name) || f.name() == http::field::server || beast::iequals(name, "x-request-id") ||
        beast::iequals(name, "x-kvroute-worker")) {
      continue;
    }
    append_field(down_head_, name, f.value());
  }
  append_field(down_head_, "Server", "kvroute");
  if (!client_.request_id().empty()) append_field(down_head_, "x-request-id", client_.request_id());
  if (svc_.config.worker_header) append_field(down_head_, "x-kvroute-worker", worker_->name());
  bool chunked = false;
  if (rewritten) {
    chunked = true;  // the body shrinks by the removed event
  } else if (auto len = up_parser_->content_length()) {
    append_field(down_head_, "Content-Length", std::to_string(*len));
  } else if (up_parser_->is_done() || status == 204 || status == 304) {
    append_field(down_head_, "Content-Length", "0");
  } else {
    chunked = true;
  }
  if (chunked && client_.request().version() < 11) {
    // An HTTP/1.0 client knows no chunked coding (RFC 9112 section 6.1): the body ends where the connection does.
    chunked = false;
    client_.set_close_after();
  }
  if (chunked) append_field(down_head_, "Transfer-Encoding", "chunked");
  if (client_.close_after()) append_field(down_head_, "Connection", "close");
  down_head_.append("\r\n");
  return chunked;
}

// Parses body bytes already in up_buffer_ into relay_ without touching the socket; returns how many it
// produced. A chunk header cut in two (need_more) or a full relay_ (need_buffer) just ends the pass.
std::size_t Exchange::parse_buffered(beast::error_code& ec) {
  auto& body = up_parser_->get().body();
  body.data = relay_.data();
  body.size = relay_.size();
  while (up_buffer_.size() > 0 && body.size > 0 && !up_parser_->is_done()) {
    const std::size_t n = up_parser_->put(up_buffer_.data(), ec);
    up_buffer_.consume(n);
    if (ec == http::error::need_more || ec == http::error::need_buffer) {
      ec = {};
      break;
    }
    if (ec || n == 0) break;
  }
  return relay_.size() - body.size;
}

void Exchange::read_body() {
  if (up_parser_->is_done()) return relay_piece(0, true);
  beast::error_code perr;
  const std::size_t got = parse_buffered(perr);
  if (perr) return broke_off(perr);
  if (got > 0 || up_parser_->is_done()) return relay_piece(got, up_parser_->is_done());
  // Plain socket reads, parsed here: Beast's read_some on an eager parser goes back to the socket whenever the
  // input ends at a chunk boundary (need_more), so each SSE event waited for the next, and a stream reached
  // the client only in 16 KB pieces or at its end.
  read_upstream(&Exchange::on_body_bytes);
}

// Reads what the worker sends next into up_buffer_; `next` takes it from there.
void Exchange::read_upstream(void (Exchange::*next)(beast::error_code, std::size_t)) {
  lease_.stream->socket().async_read_some(
      up_buffer_.prepare(kRelayChunk),
      asio::bind_executor(client_.executor(), [this, next, keep = client_.keep()](beast::error_code e, std::size_t n) {
        (this->*next)(e, n);
      }));
}

void Exchange::on_body_bytes(beast::error_code ec, std::size_t n) {
  if (!lease_.stream) return;
  up_buffer_.commit(n);
  if (ec == asio::error::eof) {
    // A body delimited by the end of the connection (no length, not chunked) is complete now; any other is cut.
    up_parser_->put_eof(ec);
    if (!ec && up_parser_->is_done()) return relay_piece(0, true);
  }
  if (ec) return broke_off(ec);
  read_body();
}

void Exchange::relay_piece(std::size_t got, bool last) {
  const std::string_view out = observer_.on_body(std::string_view(relay_.data(), got), last);
  if (out.empty() && !last) return read_body();
  write_down(out.data(), out.size(), last);
}

// Sends the next piece of the response to the client: the head if it has not gone out yet, then `size` bytes
// of body, chunk-framed for a chunked response (plus the last chunk when `last`).
void Exchange::write_down(const char* data, std::size_t size, bool last) {
  Pieces out;
  if (head_pending_) {
    out.add(down_head_.data(), down_head_.size());
    head_pending_ = false;
  }
  if (down_chunked_) {
    if (size > 0) {
      const int n = std::snprintf(chunk_line_.data(), chunk_line_.size(), "%zx\r\n", size);
      out.add(chunk_line_.data(), static_cast<std::size_t>(n));
      out.add(data, size);
      out.add("\r\n", 2);
    }
    if (last) out.add("0\r\n\r\n", 5);
  } else {
    out.add(data, size);
  }
  down_last_ = last;
  down_writing_ = true;
  asio::async_write(client_.socket(), out, [this, keep = client_.keep()](beast::error_code ec, std::size_t n) {
    on_down_written(ec, n);
  });
}

void Exchange::on_down_written(beast::error_code ec, std::size_t) {
  down_writing_ = false;
  if (!lease_.stream) return;
  if (ec) return events_.on_client_write_failed();
  if (!down_last_) return read_body();
  events_.on_relayed(up_parser_->keep_alive());
}

// The exchange outlived --request-timeout (a LazyDeadline: an exchange costs a clock read, not a timer
// operation). Before the worker's head the client gets a 504; after it, the head is already out and both
// connections close. Either way the worker sees its connection close and cancels the request.
void Exchange::on_deadline() {
  if (!lease_.stream) return;  // no exchange under way
  close_upstream();
  if (awaiting_head_) {
    return failed({FailedAt::kBeforeFirstByte,
                   "worker " + worker_->name() + " did not answer within --request-timeout (" +
                       fmt_seconds(svc_.config.request_timeout_s) + ")",
                   504, "worker_timeout"},
                  false);
  }
  broke_off(beast::error::timeout);
}

// A streamed request's worker has sent no head within --first-byte-timeout: a failure of the worker's (a hung
// engine passes its health checks), which another worker may make up for. An unstreamed request still waiting
// for its answer goes to another worker when its own was taken out of rotation meanwhile (ejected by the
// failures of other requests, or failing its health checks), if another worker may take it; else it waits on.
// A hung worker then holds unstreamed requests until it is found out, not for the whole --request-timeout.
void Exchange::on_first_byte_due() {
  if (!lease_.stream || !awaiting_head_) return;
  if (observer_.streamed()) {
    close_upstream();
    return failed({FailedAt::kBeforeFirstByte,
                   "worker " + worker_->name() + " sent no response head within --first-byte-timeout (" +
                       fmt_seconds(svc_.config.first_byte_timeout_s) + ")",
                   504, "worker_timeout", true, RouterMetrics::RetryKind::kFirstByteTimeout},
                  false);
  }
  const bool out = !worker_->healthy() || worker_->ejected();
  if (!out || !events_.may_retry()) {
    return first_byte_.set(std::chrono::steady_clock::now() + seconds(svc_.config.health_interval_s),
                           client_.weak_from_this());
  }
  close_upstream();
  failed({FailedAt::kBeforeFirstByte,
          "worker " + worker_->name() + " was taken out of rotation (" +
              (worker_->healthy() ? "ejected" : "failing its health checks") + ") before it answered",
          502, "worker_unavailable", true, RouterMetrics::RetryKind::kLeftRotation},
         false, /*worker_fault=*/false);
}

// The exchange under way has run kWatchClientAfter: its client is watched from now on.
void Exchange::on_watch_due() {
  if (lease_.stream) client_.watch_disconnect();
}

void Exchange::fail(std::string why, unsigned status, const char* code) {
  failed({FailedAt::kBeforeFirstByte, std::move(why), status, code}, false, /*worker_fault=*/false);
}

// The worker broke the exchange (a reset, a response cut off, no head in time): counted, a failure for outlier
// detection, and its health checked at once (Services::worker_broke).
void Exchange::broken() {
  count_failure(RouterMetrics::WorkerFailure::kBroken);
  outlier(false);
  if (svc_.worker_broke && !worker_->removed()) svc_.worker_broke(*worker_);
}

void Exchange::outlier(bool ok) {
  if (!svc_.outliers || worker_->removed()) return;
  if (ok) return svc_.outliers->success(*worker_);
  svc_.outliers->failure(*worker_);
}

void Exchange::count_failure(RouterMetrics::WorkerFailure failure) {
  if (!worker_->removed()) svc_.metrics.worker_failure(worker_->id(), failure);
}

void Exchange::failed(ExchangeFailure failure, bool retry_fresh, bool worker_fault, bool counted) {
  awaiting_head_ = false;
  if (lease_.stream) {
    svc_.pool.release(std::move(lease_), false);
    lease_ = {};
  }
  // A reused keep-alive connection may have been closed by the worker while idle: retry once, fresh.
  if (retry_fresh && !retried_) {
    retried_ = true;
    svc_.metrics.retried_fresh();
    return acquire(true);
  }
  retried_ = false;
  retry_ticket_.reset();
  if (worker_fault) {
    if (!counted) broken();
    // A reset or an unanswered stream: another worker may serve it. Not --request-timeout: its time is spent.
    if (failure.status != 504 || failure.kind == RouterMetrics::RetryKind::kFirstByteTimeout) failure.retryable = true;
  }
  events_.on_exchange_failed(failure);
}

// The head is already out: the client can only learn of the failure from the response itself. A stream of
// server-sent events ends with an error event, the way OpenAI's API reports an error mid-stream (and no
// [DONE], so no client takes it for a whole answer); anything else just ends with the connection.
void Exchange::broke_off(beast::error_code ec) {
  std::string why = "worker " + worker_->name() + " broke off the response: " + ec.message();
  broken();
  svc_.metrics.stream_cut();
  retry_ticket_.reset();
  // Framed for the client: chunked, or delimited by the connection's end (HTTP/1.0). Not while a write is
  // under way (--request-timeout during a slow client's write): the stream just ends.
  const bool framed = down_chunked_ || client_.request().version() < 11;
  if (event_stream_ && framed && !down_writing_ && !head_pending_) return write_error_event(std::move(why));
  events_.on_exchange_failed(ExchangeFailure{FailedAt::kAfterFirstByte, std::move(why), 502, kStreamCut});
}

void Exchange::write_error_event(std::string why) {
  // Two line ends first: they end an event the worker cut half way (a blank line alone dispatches nothing).
  std::string event = "\n\ndata: " +
                      error_json(make_error(why, 502, "upstream_error", kStreamCut)) + "\n\n";
  cut_event_.clear();
  if (down_chunked_) {
    char line[24];
    const int n = std::snprintf(line, sizeof line, "%zx\r\n", event.size());
    cut_event_.append(line, static_cast<std::size_t>(n));
    cut_event_.append(event);
    cut_event_.append("\r\n0\r\n\r\n");
  } else {
    cut_event_ = std::move(event);
  }
  down_writing_ = true;
  asio::async_write(client_.socket(), asio::buffer(cut_event_),
                    [this, keep = client_.keep(), why = std::move(why)](beast::error_code ec, std::size_t) mutable {
                      down_writing_ = false;
                      if (!lease_.stream) return;  // the client left meanwhile (its handler ended the exchange)
                      ExchangeFailure cut{FailedAt::kAfterFirstByte, std::move(why), 502, kStreamCut};
                      cut.ended_whole = !ec && down_chunked_;
                      events_.on_exchange_failed(cut);
                    });
}

void Exchange::cancel() {
  retry_ticket_.reset();
  if (lease_.stream) close_upstream();
}

void Exchange::close_upstream() {
  orphan_ = lease_.stream;  // outlives the upstream operation still completing after the close
  beast::error_code ignored;
  lease_.stream->socket().shutdown(tcp::socket::shutdown_both, ignored);
  lease_.stream->socket().close(ignored);
}

void Exchange::release(bool reusable) {
  retry_ticket_.reset();
  if (lease_.stream) {
    lease_.stream->expires_never();
    svc_.pool.release(std::move(lease_), reusable);
  }
  lease_ = {};
}

void Exchange::cancel_timers() {
  deadline_.cancel();
  watch_.cancel();
  first_byte_.cancel();
}

}  // namespace kvroute::router
