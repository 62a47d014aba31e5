// Routed inference: /v1/chat/completions, /v1/completions, /v1/responses. The request is parsed (its prefix
// chain built), tokenized when the chain should be over the workers' token ids, in a burst that reached several
// router replicas at once given its replica's turn (Router::stagger_s), routed by Router::route(), held
// while its prefix is still being computed for an earlier request (kv_cost), and forwarded.
#include <algorithm>
#include <utility>

#include <boost/asio/post.hpp>
#include <boost/beast/core/string.hpp>

#include "router/api/api_handler.h"
#include "router/api/endpoints.h"
#include "router/log.h"

namespace kvroute::router::api {

namespace beast = boost::beast;
namespace asio = boost::asio;

namespace {
constexpr auto kPrefixHoldRecheck = std::chrono::milliseconds(20);
}  // namespace

bool ApiHandler::want_tokenize() const {
  if (svc_.config.tokenize == "always") return true;
  if (svc_.config.tokenize == "never") return false;
  const auto workers = svc_.registry.snapshot();
  for (const auto& w : *workers) {
    if (w->precise()) return true;
  }
  return false;
}

void ApiHandler::handle_routed(Endpoint endpoint) {
  const auto t0 = Clock::now();
  const StringRequest& req = session_.request();
  // The router reads the body to route it, and OpenAI servers take JSON as it is: a compressed body gets a
  // clear refusal, not a JSON syntax error.
  if (const std::string_view coding = req[http::field::content_encoding];
      !coding.empty() && !beast::iequals(coding, "identity")) {
    svc_.metrics.error("bad_request");
    return session_.answer_error(make_error("request bodies with Content-Encoding '" + std::string(coding) +
                                                "' are not supported: send the JSON uncompressed",
                                            415, "invalid_request_error", "unsupported_content_encoding"));
  }
  RequestHeaders headers{req[svc_.config.session_header], req[svc_.config.tenant_header],
                         req[svc_.config.priority_header]};
  auto parsed = parse_request(endpoint, req.body(), headers,
                              ParseOptions{svc_.config.block_tokens, svc_.config.block_bytes, want_tokenize()},
                              SaltOptions{svc_.config.tenant_salt_secret, svc_.config.allow_client_cache_salt});
  if (!parsed) {
    svc_.metrics.error("bad_request");
    return session_.answer_error(parsed.error());
  }
  const std::string& previous = parsed->previous_response_id;
  if (!previous.empty() && !svc_.router.response_owner(previous)) {
    auto request = std::make_shared<RoutableRequest>(std::move(*parsed));
    return find_response_owner(session_, svc_, request->previous_response_id,
                               [this, keep = session_.keep(), request, t0] { prepare_route(std::move(*request), t0); });
  }
  prepare_route(std::move(*parsed), t0);
}

// Tokenizes the prompt when the chain should be over the workers' token ids, then routes.
void ApiHandler::prepare_route(RoutableRequest parsed, Clock::time_point t0) {
  if (!parsed.tokenize_body.empty()) {
    if (TokenIds cached = svc_.tokenize_cache.get(parsed.tokenize_key)) {
      use_token_ids(parsed, *cached, svc_.config.block_tokens);
      svc_.metrics.tokenized("cache_hit", 0.0);
      return take_turn(std::move(parsed), t0);
    }
    auto worker = svc_.router.any_healthy(parsed.model);  // the model's tokenizer
    if (worker) {
      auto request = std::make_shared<RoutableRequest>(std::move(parsed));
      const std::string body = request->tokenize_body;
      const auto timeout = std::chrono::milliseconds(static_cast<long long>(svc_.config.tokenize_timeout_s * 1000));
      backends::http_post(session_.executor(), worker->endpoint(), "/tokenize", body, timeout,
                          [this, keep = session_.keep(), request, t0](Result<backends::SimpleResponse> r) {
                            asio::post(session_.executor(), [this, keep, request, t0, r = std::move(r)]() mutable {
                              on_tokenized(std::move(*request), t0, std::move(r));
                            });
                          },
                          16u << 20, svc_.config.worker_authorization());
      return;
    }
  }
  take_turn(std::move(parsed), t0);
}

void ApiHandler::on_tokenized(RoutableRequest request, Clock::time_point t0, Result<backends::SimpleResponse> r) {
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  std::optional<std::vector<std::uint32_t>> tokens;
  std::string why;
  if (!r) {
    why = r.error().message;
  } else if (r->status != 200) {
    why = "/tokenize answered " + std::to_string(r->status);
  } else if (auto parsed = parse_tokenize_response(r->body); !parsed) {
    why = parsed.error().message;
  } else {
    tokens = std::move(*parsed);
  }
  if (tokens) {
    auto shared = std::make_shared<const std::vector<std::uint32_t>>(std::move(*tokens));
    use_token_ids(request, *shared, svc_.config.block_tokens);
    svc_.tokenize_cache.put(request.tokenize_key, std::move(shared));
    svc_.metrics.tokenized("tokenized", took);
  } else {
    // The text chain stays: routing goes on, only less precisely.
    LOG_DEBUG("request " << session_.request_id() << ": tokenization failed (" << why << "); routing on the text");
    svc_.metrics.tokenized("fallback", took);
  }
  take_turn(std::move(request), t0);
}

// A request that came in a burst reaching several replicas at once waits its turn: a few stream delays, so that
// this replica sees what the others routed for the same burst (policy/burst_stagger.h). Its TTFT counts from t0.
void ApiHandler::take_turn(RoutableRequest parsed, Clock::time_point t0) {
  const double wait_s = svc_.router.stagger_s(parsed);
  if (wait_s <= 0) return route_parsed(std::move(parsed), t0);
  auto request = std::make_shared<RoutableRequest>(std::move(parsed));
  if (!hold_timer_) hold_timer_.emplace(session_.executor());
  hold_timer_->expires_after(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(wait_s)));
  hold_timer_->async_wait([this, keep = session_.keep(), request, t0](beast::error_code ec) {
    if (!ec) route_parsed(std::move(*request), t0);
  });
}

void ApiHandler::route_parsed(RoutableRequest parsed, Clock::time_point t0) {
  reroutes_ = 0;
  tried_.clear();
  auto decision = svc_.router.route(parsed);
  if (!decision) return session_.answer_error(decision.error());
  decision_ = std::move(*decision);
  decision_->start = t0;
  strip_usage_ = parsed.strip_usage;
  up_body_ = std::move(parsed.upstream_body);
  routable_ = std::move(parsed);  // kept to route again if the worker cannot be reached
  note_decision();
  LOG_DEBUG("request " << session_.request_id() << " -> " << decision_->worker->name() << " ("
            << policy::reason_name(decision_->pick.reason) << ", predicted cached "
            << decision_->pick.predicted_cached_tokens << "/" << decision_->prompt_tokens << ")"
            << (decision_->hold_leader ? ", held for its prefix" : ""));
  if (decision_->hold_leader) return wait_for_prefix();
  forward(decision_->worker);
}

// The worker could not be connected to (ApiHandler::on_connect_failed), or failed the request before its first
// byte (failover.cc): the request is routed again, to none of the workers that failed it.
void ApiHandler::route_again() {
  const auto t0 = decision_->start;
  forget_predicted_prefix();
  svc_.router.complete(*decision_, Outcome{false, std::nullopt, /*worker_failed=*/false});
  decision_.reset();
  access_.retries = reroutes_;
  auto again = svc_.router.route(*routable_, tried_);
  if (!again) {
    exchange_.release(false);  // the retry it would have carried ends here
    return session_.answer_error(again.error());
  }
  decision_ = std::move(*again);
  decision_->start = t0;
  note_decision();
  forward(decision_->worker);
}

// kv_cost's prefix hold (Router::prefix_held): the worker is still computing this request's prefix for an
// earlier one. The router wakes it when that request has its first byte or the worker's event stores the
// prefix (Router::watch_prefix_hold); it also checks every kPrefixHoldRecheck (for a block that left the index)
// and at --prefix-hold, then the request goes. Every wake-up or check carries the hold's sequence number, so
// only the latest counts.
void ApiHandler::wait_for_prefix() {
  const std::uint64_t seq = ++hold_seq_;
  svc_.router.unwatch_prefix_hold(std::exchange(hold_watch_, 0));
  // Watched before checking, so that a first byte or event between the check and the watch is not missed.
  hold_watch_ = svc_.router.watch_prefix_hold(
      *decision_, [this, weak = session_.weak_from_this(), seq, ex = session_.executor()] {
        asio::post(ex, [this, weak, seq] {
          if (auto alive = weak.lock()) on_hold_wake(seq);
        });
      });
  if (!svc_.router.prefix_held(*decision_)) {
    end_hold();
    return forward(decision_->worker);
  }
  session_.watch_disconnect();  // a client that leaves meanwhile: its request is never sent (on_client_gone())
  if (!hold_timer_) hold_timer_.emplace(session_.executor());
  const auto left = decision_->hold_until - Clock::now();
  hold_timer_->expires_after(std::min<Clock::duration>(kPrefixHoldRecheck, left));
  hold_timer_->async_wait([this, keep = session_.keep(), seq](beast::error_code ec) {
    if (!ec) on_hold_wake(seq);
  });
}

void ApiHandler::on_hold_wake(std::uint64_t seq) {
  if (seq != hold_seq_ || !held_for_prefix()) return;
  wait_for_prefix();
}

// The hold is over (the request goes, or its client left): later wake-ups and checks find nothing to do.
void ApiHandler::end_hold() {
  ++hold_seq_;
  svc_.router.unwatch_prefix_hold(std::exchange(hold_watch_, 0));
  svc_.router.prefix_hold_ended(*decision_);
}

}  // namespace kvroute::router::api
