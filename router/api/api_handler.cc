#include "router/api/api_handler.h"

#include <algorithm>

#include "net/resource_errors.h"
#include "router/api/endpoints.h"
#include "router/log.h"
#include "router/warm_up.h"

namespace kvroute::router::api {

namespace beast = boost::beast;

namespace {

// Inference routes that vLLM and SGLang serve outside /v1/, passed through like /v1/* ones. Workers' control
// routes (/flush_cache, /load, ...) are not: they would reach one worker of many.
bool passed_through_root_route(std::string_view path) {
  static constexpr std::string_view kRoutes[] = {"/tokenize", "/detokenize", "/pooling", "/classify", "/score",
                                                 "/rerank",   "/generate",   "/encode"};
  return std::find(std::begin(kRoutes), std::end(kRoutes), path) != std::end(kRoutes);
}

}  // namespace

ApiHandler::ApiHandler(ClientSession& session, Services& svc)
    : session_(session),
      svc_(svc),
      access_log_(svc.config.access_log),
      admission_(svc.admission),
      observer_(svc.router, decision_),
      exchange_(session, svc, observer_, *this) {}

void ApiHandler::on_request() {
  if (access_log_) {
    access_ = AccessRecord{};
    access_.at = std::chrono::system_clock::now();
    access_.start = Clock::now();
    worker_.reset();
  }
  observer_.end_background_watch();
  handle_api(target_path(session_.request().target()));
}

void ApiHandler::handle_api(std::string_view path) {
  const auto method = session_.request().method();
  const std::string_view method_name = session_.request().method_string();
  const bool get_or_head = method == http::verb::get || method == http::verb::head;
  if (path == "/health") {
    if (!get_or_head) return session_.answer_error(method_not_allowed(method_name, "GET"));
    return session_.answer_json(200, R"({"status":"ok"})");
  }
  if (path == "/ready") {
    if (!get_or_head) return session_.answer_error(method_not_allowed(method_name, "GET"));
    if (session_.draining()) {
      return session_.answer_error(make_error("shutting down", 503, "service_unavailable", "draining"));
    }
    if (svc_.router.any_healthy()) return session_.answer_json(200, R"({"status":"ready"})");
    return session_.answer_error(make_error("no healthy worker", 503, "service_unavailable", "no_healthy_worker"));
  }
  if (!authenticate()) return;
  if (admission_) return admit();
  dispatch(path);
}

void ApiHandler::dispatch(std::string_view path) {
  const auto method = session_.request().method();
  const std::string_view method_name = session_.request().method_string();  if (path == "/v1/chat/completions" || path == "/v1/completions" || path == "/v1/responses") {
    if (method != http::verb::post) return session_.answer_error(method_not_allowed(method_name, "POST"));
    return handle_routed(path == "/v1/chat/completions" ? Endpoint::kChatCompletions
                         : path == "/v1/completions"    ? Endpoint::kCompletions
                                                        : Endpoint::kResponses);
  }
  if (path == "/v1/models") {
    if (method != http::verb::get) return session_.answer_error(method_not_allowed(method_name, "GET"));
    return serve_models(session_, svc_);
  }
  if (path == "/v1/load_lora_adapter" || path == "/v1/unload_lora_adapter") {
    if (method != http::verb::post) return session_.answer_error(method_not_allowed(method_name, "POST"));
    return serve_lora_update(session_, svc_, std::string(path));
  }
  if (path.starts_with("/v1/") || passed_through_root_route(path)) return handle_passthrough(path);
  session_.answer_error(no_route(method_name, path));
}

// ---- the exchange ----
void ApiHandler::forward(std::shared_ptr<backends::Worker> worker) {
  worker_ = worker;
  // Nothing of an earlier exchange on this connection may be read as this one's usage (finish() reads it even
  // when the exchange ends before the worker's head).
  observer_.begin(routable_ && routable_->endpoint == Endpoint::kResponses, strip_usage_);
  exchange_.start(std::move(worker), up_body_);
}

void ApiHandler::on_relayed(bool reusable) {
  const unsigned status = session_.status();
  // A 4xx is the client's error, answered by the worker: not an upstream failure (Exchange::on_head counted it).
  if (status >= 500) forget_predicted_prefix();  // failover.cc
  finish(status >= 200 && status < 300, reusable, /*worker_failed=*/status >= 500);
  session_.answered();
}

// Ends the exchange once: releases the upstream connection and tells the router how it went.
void ApiHandler::finish(bool ok, bool reusable, bool worker_failed) {
  observer_.settle_background(ok, session_.status());
  exchange_.release(reusable);
  if (!decision_) return;
  Outcome o;
  o.ok = ok;
  o.worker_failed = worker_failed;
  o.usage = observer_.usage();
  if (decision_->first_byte_seen && !decision_->background) access_.ttft_s = decision_->ttft_s;
  access_.usage = o.usage;
  svc_.router.complete(*decision_, o);
  decision_.reset();
  routable_.reset();  // its chain is not kept for as long as the connection idles
}

void ApiHandler::on_exchange_failed(const ExchangeFailure& failure) {
  LOG_WARN("request " << session_.request_id() << ": " << failure.why);
  if (failure.retryable && retry_elsewhere(failure)) return;  // failover.cc
  access_.error = failure.code;
  if (failure.where == FailedAt::kAfterFirstByte) {
    access_.stream_cut = true;
    // A stream ended by its error event is framed whole: the connection may serve the client's next request.
    if (failure.ended_whole) {
      finish(false, false);
      return session_.answered();
    }
    session_.set_close_after();
    finish(false, false);
    return session_.close();
  }
  if (decision_) {
    if (failure.retryable) forget_predicted_prefix();  // the worker failed it (failover.cc)
    svc_.router.complete(*decision_, Outcome{false, std::nullopt});
    decision_.reset();
    routable_.reset();
  }
  session_.answer_error(make_error(failure.why, failure.status, "upstream_error", failure.code));
}

// Nothing was sent, so the request can go elsewhere: a worker that refuses connections (or does not answer
// them within --connect-timeout) is taken out of rotation at once, without waiting for its health checks, and
// the request is routed again, up to --max-retries times. Out of descriptors here, no worker is to blame.
void ApiHandler::on_connect_failed(beast::error_code ec) {
  const std::string reason = ec == beast::error::timeout ? std::string("timed out") : ec.message();
  const std::string why = "cannot connect to worker " + worker_->name() + ": " + reason;
  if (net::local_resource_error(ec)) return exchange_.fail(why, 503, "router_overloaded");
  if (!worker_->removed()) svc_.metrics.worker_failure(worker_->id(), RouterMetrics::WorkerFailure::kConnect);
  svc_.worker_unreachable(*worker_, "could not be connected to (" + reason + ")");
  if (reroutes_ >= svc_.config.max_retries) return exchange_.fail(why);
  ++reroutes_;
  svc_.metrics.rerouted();
  LOG_INFO("request " << session_.request_id() << ": " << why << "; routing it again");
  if (!decision_) return forward_to_least_loaded();
  tried_.push_back(worker_->id());
  route_again();
}

// The client went away (a disconnect noticed, or a write that failed): the worker's connection is dropped so
// that it cancels the request, and a request held for its prefix is never sent.
void ApiHandler::on_client_gone() {
  leave_queue();
  const bool held = held_for_prefix();
  if (held) end_hold();
  exchange_.cancel();
  LOG_DEBUG("request " << session_.request_id() << ": client disconnected; "
            << (held ? "its request, held for its prefix, is not sent" : "upstream request cancelled"));
  access_.client_gone = true;
  svc_.metrics.error("client_disconnected");
  finish(false, false, /*worker_failed=*/false);
  session_.close();
}

void ApiHandler::on_request_end() {
  leave_queue();
  release_slot();
  if (!access_log_) return;
  write_access_log(access_, session_.request(), session_.request_id(), worker_.get(), session_.status());
}

void ApiHandler::note_decision() {
  access_.reason = policy::reason_name(decision_->pick.reason);
  access_.prompt_tokens = decision_->prompt_tokens;
  access_.predicted_cached_tokens = decision_->pick.predicted_cached_tokens;
  if (decision_->warm_up) {
    const StringRequest& req = session_.request();
    send_warm_up(svc_, session_.executor(), std::move(decision_->warm_up), std::string(req.target()),
                 up_body_.empty() ? std::string_view(req.body()) : std::string_view(up_body_));
  }
}

}  // namespace kvroute::router::api
