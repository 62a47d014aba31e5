#include "backends/sim/server/session.h"

#include <algorithm>

#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/bind_handler.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/write.hpp>

#include <chrono>
#include <cstdio>

#include "backends/sim/server/tokenizer.h"

namespace kvroute::sim {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;

namespace {

constexpr auto kWriteTimeout = std::chrono::seconds(30);
constexpr std::size_t kHeaderLimit = 64 * 1024;
// SSE bytes a slow reader may leave unsent before its request is dropped (a cap on queued output).
constexpr std::size_t kMaxQueuedStreamBytes = 16u << 20;
// GET /v1/responses/{id}, POST /v1/responses/{id}/cancel
constexpr std::string_view kResponsesPrefix = "/v1/responses/";
constexpr std::string_view kCancelSuffix = "/cancel";

std::chrono::steady_clock::duration seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}

std::int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A Responses API request run with background=true: no HTTP exchange waits for it, so it observes its own
// engine request and keeps its stored entry current (queued, in_progress, then completed with the output and
// the conversation a follow-up continues), as vLLM's background task updates its response store. The worker
// keeps it alive while its request is in flight; it reaches the store through the worker, which outlives it.
class BackgroundResponse final : public RequestObserver {
 public:
  BackgroundResponse(SimWorker& worker, ResponsesFormatter fmt, std::vector<std::uint32_t> prompt)
      : worker_(worker), fmt_(std::move(fmt)), conversation_(std::move(prompt)) {}

  void started(std::uint64_t request, std::uint64_t fingerprint) {
    fingerprint_ = fingerprint;
    StoredResponse r;
    r.conversation = conversation_;
    r.object = fmt_.without_output("queued");
    r.status = "queued";
    r.request = request;
    r.cancelled = fmt_.without_output("cancelled");
    worker_.responses().put(fmt_.id(), std::move(r));
  }

  void on_first_token(std::uint32_t) override {
    StoredResponse* r = entry();
    if (r == nullptr) return;
    r->status = "in_progress";
    r->object = fmt_.in_progress();
  }
  void on_token(std::uint32_t index) override { text_.append(generated_piece(fingerprint_, index)); }
  void on_finish(const ApiUsage& usage) override {
    StoredResponse* r = entry();
    if (r == nullptr) return;
    tokenize_append(text_, conversation_);
    r->conversation = std::move(conversation_);
    r->object = fmt_.completed(text_, usage);
    r->status = "completed";
    r->request = 0;
    r->cancelled.clear();
  }

 private:
  // The stored entry, unless it was cancelled or dropped from the store meanwhile.
  StoredResponse* entry() {
    StoredResponse* r = worker_.responses().find(fmt_.id());
    return r != nullptr && (r->status == "queued" || r->status == "in_progress") ? r : nullptr;
  }

  SimWorker& worker_;
  ResponsesFormatter fmt_;
  std::vector<std::uint32_t> conversation_;
  std::uint64_t fingerprint_ = 0;
  std::string text_;
};

// Network failures end the connection silently; only protocol errors get an answer.
bool is_protocol_error(const beast::error_code& ec) { return ec.category() == http::make_error_code(http::error::bad_target).category(); }

}  // namespace

SimSession::SimSession(net::ip::tcp::socket socket, std::shared_ptr<SimWorker> worker)
    : stream_(std::move(socket)), worker_(std::move(worker)) {}

void SimSession::run() { do_read(); }

// --fault hang: the request is read and never answered; the connection stays open until the client closes it
// (a hung engine behind a live HTTP server). The read only notices that close.
void SimSession::hang() {
  stream_.expires_never();
  hang_buffer_.resize(512);
  stream_.socket().async_read_some(net::buffer(hang_buffer_), [self = shared_from_this()](beast::error_code ec, std::size_t) {
    if (ec) return self->close();
    self->hang();
  });
}

void SimSession::do_read() {
  if (closed_) return;
  parser_.emplace();
  parser_->body_limit(worker_->config().max_body_bytes);
  parser_->header_limit(kHeaderLimit);
  stream_.expires_after(seconds(worker_->config().idle_timeout_s));
  // The header first: a client that sent "Expect: 100-continue" (curl does for bodies over 1 KiB) waits
  // for our interim response before it sends the body.
  http::async_read_header(stream_, buffer_, *parser_,
                          beast::bind_front_handler(&SimSession::on_header, shared_from_this()));
}

void SimSession::on_header(beast::error_code ec, std::size_t bytes) {
  if (ec) return on_read(ec, bytes);
  const auto& req = parser_->get();
  const auto expect = req[http::field::expect];
  if (beast::iequals(expect, "100-continue") && !parser_->is_done()) {
    static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
    stream_.expires_after(kWriteTimeout);
    net::async_write(stream_, net::buffer(kContinue.data(), kContinue.size()),
                     [self = shared_from_this()](beast::error_code wec, std::size_t) {
                       if (wec) return self->close();
                       self->read_body();
                     });
    return;
  }
  read_body();
}

void SimSession::read_body() {
  stream_.expires_after(seconds(worker_->config().idle_timeout_s));
  http::async_read(stream_, buffer_, *parser_, beast::bind_front_handler(&SimSession::on_read, shared_from_this()));
}

void SimSession::on_read(beast::error_code ec, std::size_t) {
  if (ec == http::error::end_of_stream) return close();
  if (ec == http::error::body_limit) {
    keep_alive_ = false;
    return send_error(make_error("request body exceeds " + std::to_string(worker_->config().max_body_bytes) +
                                     " bytes",
                                 413));
  }
  if (ec && is_protocol_error(ec)) {
    keep_alive_ = false;
    return send_error(make_error("malformed HTTP request: " + ec.message()));
  }
  if (ec) return close();  // timeout, reset, operation_aborted on shutdown: nothing to answer
  handle(parser_->get());
}

void SimSession::handle(Request& req) {
  keep_alive_ = req.keep_alive();
  std::string_view target(req.target().data(), req.target().size());
  if (auto q = target.find('?'); q != std::string_view::npos) target = target.substr(0, q);
  const auto method = req.method();
  // As vLLM with --api-key: every /v1 route wants the key as a bearer token; the others (health, metrics,
  // tokenize) stay open.
  if (const std::string& key = worker_->config().api_key; !key.empty() && target.starts_with("/v1")) {
    const std::string_view auth(req[http::field::authorization].data(), req[http::field::authorization].size());
    if (auth.size() != key.size() + 7 || !auth.starts_with("Bearer ") || auth.substr(7) != key) {
      return send_json(401, R"({"error":"Unauthorized"})");
    }
  }
  if (target == "/v1/completions" || target == "/v1/chat/completions" || target == "/v1/responses") {
    if (const unsigned status = worker_->config().fail_status) {
      return send_error(make_error("fault injected (--fault " + std::to_string(status) + ")", static_cast<int>(status),
                                   "ServiceUnavailableError", "fault_injected"));
    }
    if (worker_->config().hang) return hang();
  }
  auto need = [&](http::verb v) {
    if (method == v) return true;
    send_error(make_error("method not allowed for " + std::string(target), 405));
    return false;
  };
  if (target == "/v1/completions") {
    if (need(http::verb::post)) start_completion(ApiKind::kCompletion, req);
  } else if (target == "/v1/chat/completions") {
    if (need(http::verb::post)) start_completion(ApiKind::kChat, req);
  } else if (target == "/v1/responses") {
    if (need(http::verb::post)) start_response(req);
  } else if (target.starts_with(kResponsesPrefix) && target.find('/', kResponsesPrefix.size()) == std::string_view::npos) {
    if (need(http::verb::get)) get_response(target.substr(kResponsesPrefix.size()));
  } else if (target.starts_with(kResponsesPrefix) && target.ends_with(kCancelSuffix) &&
             target.size() > kResponsesPrefix.size() + kCancelSuffix.size() &&
             target.find('/', kResponsesPrefix.size()) == target.size() - kCancelSuffix.size()) {
    if (need(http::verb::post)) {
      cancel_response(target.substr(kResponsesPrefix.size(), target.size() - kResponsesPrefix.size() - kCancelSuffix.size()));
    }
  } else if (target == "/v1/load_lora_adapter" || target == "/v1/unload_lora_adapter") {
    if (need(http::verb::post)) update_lora(target == "/v1/load_lora_adapter", req.body());
  } else if (target == "/health") {
    if (need(http::verb::get)) send_json(200, "");
  } else if (target == "/v1/models") {
    if (need(http::verb::get)) send_json(200, worker_->models_json());
  } else if (target == "/metrics") {
    if (need(http::verb::get)) {
      Response res{http::status::ok, 11};
      res.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
      res.body() = worker_->metrics_text();
      send(std::move(res));
    }
  } else if (target == "/tokenize") {
    if (need(http::verb::post)) {
      const auto& limits = worker_->config().limits;
      auto toks = parse_tokenize_request(req.body(), limits);
      if (!toks) return send_error(toks.error());
      send_json(200, tokenize_response(*toks, limits.max_model_len));
    }
  } else if (target == "/debug/kv_blocks") {
    if (need(http::verb::get)) send_json(200, worker_->kv_blocks_json());
  } else if (target == "/reset_prefix_cache") {
    if (need(http::verb::post)) {
      if (worker_->reset_prefix_cache()) return send_json(200, "");
      send_error(make_error("cannot reset the prefix cache while requests hold blocks", 409, "server_error"));
    }
  } else if (target == "/version") {
    if (need(http::verb::get)) send_json(200, "{\"version\":\"kvroute-sim\"}");
  } else {
    send_error(make_error("no route for " + std::string(target), 404, "NotFoundError", "not_found"));
  }
}

bool SimSession::submit(ApiRequest request) {
  const bool stream = request.stream;
  auto sub = worker_->submit(std::move(request), shared_from_this());
  if (!sub) {
    send_error(sub.error());
    return false;
  }
  // No engine callback can come before we return: the engine advances on the worker's timer.
  active_ = true;
  stream_mode_ = stream;
  request_id_ = sub->id;
  fingerprint_ = sub->fingerprint;
  cached_tokens_ = 0;
  text_.clear();
  if (stream_mode_) {
    header_pending_ = true;
    stream_done_ = false;
    out_pending_.clear();
  }
  return true;
}

void SimSession::start_completion(ApiKind kind, Request& req) {
  auto parsed = parse_api_request(kind, req.body(), worker_->config().limits);
  if (!parsed) return send_error(parsed.error());
  include_usage_ = parsed->include_usage;
  if (!submit(std::move(*parsed))) return;
  responses_api_ = false;
  // Like vLLM, the response id carries the caller's X-Request-Id when there is one (a bounded, printable one),
  // so the same request sent twice gets the same response.
  std::string caller_id(req["x-request-id"]);
  const bool usable = !caller_id.empty() && caller_id.size() <= 128 &&
                      std::all_of(caller_id.begin(), caller_id.end(), [](char c) { return c > 0x20 && c < 0x7f && c != '"' && c != '\\'; });
  const std::string id = std::string(kind == ApiKind::kChat ? "chatcmpl-" : "cmpl-") +
                         (usable ? caller_id
                                 : "sim" + std::to_string(worker_->config().index) + "-" + std::to_string(request_id_));
  fmt_.emplace(kind, id, unix_seconds(), worker_->config().limits.served_model_name);
  // The head goes out at once; the chat role chunk waits for the first token, as vLLM yields it on the
  // engine's first output (serving_chat.py, first_iteration), so a stream's first event is its first token.
  if (stream_mode_) schedule_flush();
  watch();
}

void SimSession::start_response(Request& req) {
  const auto& limits = worker_->config().limits;
  auto parsed = parse_responses_request(req.body(), limits);
  if (!parsed) return send_error(parsed.error());
  ApiRequest& api = parsed->api;
  if (parsed->previous_response_id) {
    // Only this worker's store: a response made elsewhere is unknown here, as on vLLM.
    const StoredResponse* prev = worker_->responses().find(*parsed->previous_response_id);
    if (prev == nullptr) return send_error(response_not_found(*parsed->previous_response_id));
    api.prompt_tokens = continue_chat(prev->conversation, api.prompt_tokens);
  }
  if (auto e = check_context_length(api, limits)) return send_error(*e);
  if (parsed->background) return start_background_response(std::move(api));
  store_ = parsed->store;
  if (store_) conversation_.assign(api.prompt_tokens.begin(), api.prompt_tokens.end());
  if (!submit(std::move(api))) return;
  responses_api_ = true;
  rfmt_.emplace(new_response_formatter());
  if (stream_mode_) {
    rfmt_->sse_created(out_pending_);  // at once, as vLLM sends created and in_progress before the engine runs
    schedule_flush();
  }
  watch();
}

// A new response's formatter: fresh response and message ids from this worker's store, created now.
ResponsesFormatter SimSession::new_response_formatter() {
  auto& store = worker_->responses();
  std::string id = store.new_id("resp_");
  return ResponsesFormatter(std::move(id), store.new_id("msg_"), unix_seconds(),
                            worker_->config().limits.served_model_name);
}

void SimSession::start_background_response(ApiRequest api) {
  ResponsesFormatter fmt = new_response_formatter();
  std::string queued = fmt.without_output("queued");
  std::vector<std::uint32_t> prompt(api.prompt_tokens.begin(), api.prompt_tokens.end());
  auto job = std::make_shared<BackgroundResponse>(*worker_, std::move(fmt), std::move(prompt));
  auto sub = worker_->submit(std::move(api), job);
  if (!sub) return send_error(sub.error());
  job->started(sub->id, sub->fingerprint);  // no engine callback comes before the worker's timer fires
  send_json(200, std::move(queued));
}

// vLLM's runtime LoRA updating: {"lora_name", "lora_path"} to load, {"lora_name"} to unload; a plain-text
// "Success: ..." or vLLM's error.
void SimSession::update_lora(bool load, const std::string& body) {
  auto request = parse_lora_request(body);
  if (!request) return send_error(request.error());
  auto done = load ? worker_->load_lora_adapter(request->name, request->path)
                   : worker_->unload_lora_adapter(request->name);
  if (!done) return send_error(done.error());
  Response res{http::status::ok, parser_->get().version()};
  res.set(http::field::content_type, "text/plain; charset=utf-8");
  res.body() = std::move(*done);
  send(std::move(res));
}

void SimSession::get_response(std::string_view id) {
  const StoredResponse* r = worker_->responses().find(id);
  if (r == nullptr) return send_error(response_not_found(id));
  send_json(200, r->object);
}

// vLLM's cancel: a background response still queued or in progress stops and is stored as cancelled; any other
// is an error (400, vLLM's words), an unknown id a 404.
void SimSession::cancel_response(std::string_view id) {
  StoredResponse* r = worker_->responses().find(id);
  if (r == nullptr) return send_error(response_not_found(id));
  if (r->status != "queued" && r->status != "in_progress") {
    return send_error(make_error("Cannot cancel a synchronous response."));
  }
  const std::uint64_t request = r->request;
  r->status = "cancelled";
  r->request = 0;
  r->object = std::move(r->cancelled);
  r->cancelled.clear();
  worker_->cancel(request);
  send_json(200, r->object);
}

// ---- RequestObserver ----

void SimSession::on_first_token(std::uint32_t cached_tokens) { cached_tokens_ = cached_tokens; }

void SimSession::on_token(std::uint32_t index) {
  if (!active_) return;
  const std::string_view piece = generated_piece(fingerprint_, index);
  // A Responses stream needs the text too: response.completed repeats it.
  if (!stream_mode_ || responses_api_) text_.append(piece);
  if (!stream_mode_) return;
  if (responses_api_) {
    rfmt_->sse_delta(out_pending_, piece);
  } else {
    if (index == 0) fmt_->sse_role(out_pending_);
    fmt_->sse_token(out_pending_, piece);
  }
  if (out_pending_.size() > kMaxQueuedStreamBytes) {
    // The client does not read; drop it. close() cancels the request (deferred by the worker if we are
    // inside its advance()).
    return close();
  }
  schedule_flush();
}

void SimSession::on_finish(const ApiUsage& usage) {
  if (!active_) return;
  active_ = false;
  if (responses_api_) return finish_response(usage);
  if (!stream_mode_) {
    Response res{http::status::ok, parser_->get().version()};
    res.set(http::field::content_type, "application/json");
    res.body() = fmt_->full(text_, usage);
    return send(std::move(res));
  }
  fmt_->sse_finish(out_pending_);
  if (include_usage_) fmt_->sse_usage(out_pending_, usage);
  ResponseFormatter::sse_done(out_pending_);
  stream_done_ = true;
  schedule_flush();
}

void SimSession::finish_response(const ApiUsage& usage) {
  std::string object = rfmt_->completed(text_, usage);
  if (store_) {
    // The conversation a follow-up continues: this prompt, then the output's tokens (each generated piece is
    // one token, so tokenizing the text gives exactly the ids the engine hashed for the output).
    tokenize_append(text_, conversation_);
    worker_->responses().put(rfmt_->id(), StoredResponse::completed(std::move(conversation_), object));
    conversation_.clear();
  }
  if (!stream_mode_) return send_json(200, std::move(object));
  rfmt_->sse_completed(out_pending_, text_, object);  // no [DONE] in this API
  stream_done_ = true;
  schedule_flush();
}

// ---- plain responses ----

void SimSession::send_json(unsigned status, std::string body) {
  Response res{static_cast<http::status>(status), parser_ ? parser_->get().version() : 11u};
  res.set(http::field::content_type, "application/json");
  res.body() = std::move(body);
  send(std::move(res));
}

void SimSession::send_error(const Error& e) { send_json(static_cast<unsigned>(e.status), error_body(e)); }

void SimSession::send(Response res) {
  if (closed_) return;
  res.set(http::field::server, "kvroute-sim");
  res.keep_alive(keep_alive_);
  res.prepare_payload();
  res_.emplace(std::move(res));
  stream_.expires_after(kWriteTimeout);
  http::async_write(stream_, *res_,
                    beast::bind_front_handler(&SimSession::on_write, shared_from_this(), res_->keep_alive()));
}

void SimSession::on_write(bool keep_alive, beast::error_code ec, std::size_t) {
  res_.reset();
  if (ec) return close();
  if (!keep_alive) return close();
  finish_exchange();
}

// ---- streaming ----

void SimSession::schedule_flush() {
  if (flush_posted_ || writing_) return;  // a write in flight flushes again when it completes
  flush_posted_ = true;
  net::post(stream_.get_executor(), [self = shared_from_this()] {
    self->flush_posted_ = false;
    self->flush();
  });
}

void SimSession::flush() {
  if (writing_ || closed_ || (out_pending_.empty() && !header_pending_)) return;
  out_writing_.clear();
  if (header_pending_) {
    // Written by hand rather than through a Beast serializer so that it shares one write with the first
    // chunk; the fields are fixed, only Connection depends on the request.
    header_pending_ = false;
    out_writing_.append(parser_->get().version() == 10 ? "HTTP/1.0" : "HTTP/1.1");
    out_writing_.append(" 200 OK\r\nServer: kvroute-sim\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
                        "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n");
    out_writing_.append(keep_alive_ ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n");
  }
  // One HTTP chunk per write: every SSE event queued since the last write goes out together (none with a
  // head sent alone: a zero-size chunk would end the body).
  if (!out_pending_.empty()) {
    char size_line[24];
    const int n = std::snprintf(size_line, sizeof size_line, "%zx\r\n", out_pending_.size());
    out_writing_.append(size_line, static_cast<std::size_t>(n));
    out_writing_.append(out_pending_).append("\r\n");
  }
  if (stream_done_) {
    out_writing_.append("0\r\n\r\n");  // last-chunk: the response is complete
    last_write_ = true;
  }
  out_pending_.clear();
  writing_ = true;
  stream_.expires_after(kWriteTimeout);
  net::async_write(stream_, net::buffer(out_writing_),
                   beast::bind_front_handler(&SimSession::on_stream_write, shared_from_this()));
}

void SimSession::on_stream_write(beast::error_code ec, std::size_t) {
  writing_ = false;
  if (ec) return close();  // the client is gone: close() cancels the request
  if (!out_pending_.empty()) return flush();
  if (last_write_) {
    last_write_ = false;
    stream_done_ = false;
    if (!keep_alive_) return close();
    finish_exchange();
  }
}

// ---- disconnect detection ----

void SimSession::watch() {
  if (watching_ || closed_) return;
  watching_ = true;
  // On the raw socket, not through tcp_stream: this read must not be subject to the idle timeout (a long
  // generation is not idleness), and tcp_stream allows one read at a time anyway.
  stream_.socket().async_read_some(buffer_.prepare(4096),
                                   beast::bind_front_handler(&SimSession::on_watch, shared_from_this()));
}

void SimSession::on_watch(beast::error_code ec, std::size_t bytes) {
  watching_ = false;
  if (!ec) {
    buffer_.commit(bytes);  // a pipelined request: parse it after this exchange
  } else if (ec != net::error::operation_aborted) {
    return close();  // EOF or reset while the request runs: the client is gone
  }
  if (closed_) return;
  if (want_read_) {
    want_read_ = false;
    do_read();
  }
}

void SimSession::finish_exchange() {
  if (watching_) {
    // Stop the watch; its handler (operation_aborted, or data that raced in) starts the next read.
    want_read_ = true;
    beast::error_code ignored;
    stream_.socket().cancel(ignored);
    return;
  }
  do_read();
}

void SimSession::close() {
  if (active_) {
    active_ = false;
    worker_->cancel(request_id_);
  }
  if (closed_) return;
  closed_ = true;
  beast::error_code ignored;
  stream_.socket().shutdown(net::ip::tcp::socket::shutdown_both, ignored);
  stream_.socket().close(ignored);
}

}  // namespace kvroute::sim
