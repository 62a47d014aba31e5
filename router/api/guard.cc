// Authentication and admission control of an API request, before its endpoint runs (docs/reliability.md).
//
// A client API key (--api-keys-file) names the request's tenant: it is written into the tenant header
// (--tenant-header) in place of whatever the client sent, so the tenant's cache_salt (router/cache_salt.h),
// its namespace in the index and its admission queue all follow the key. The key itself never reaches a
// worker: the Authorization field is removed, or replaced by --worker-api-key.
//
// Admission (router/admission.h) gives the request a slot under --max-concurrent-requests, or queues it; a
// queued request watches for its client leaving and gives up after --queue-timeout with a 429.
#include <boost/asio/post.hpp>

#include "router/api/api_handler.h"
#include "router/log.h"

namespace kvroute::router::api {

namespace asio = boost::asio;
namespace beast = boost::beast;

bool ApiHandler::authenticate() {
  const StringRequest& req = session_.request();
  if (!svc_.api_keys) {
    tenant_ = std::string(req[svc_.config.tenant_header]);
    return true;
  }
  auto tenant = svc_.api_keys->tenant_for(req[http::field::authorization]);
  if (!tenant) {
    svc_.metrics.error("unauthorized");
    auto res = error_response(tenant.error());
    res->set(http::field::www_authenticate, "Bearer");
    session_.answer(std::move(res));
    return false;
  }
  tenant_ = std::move(*tenant);
  StringRequest& up = session_.request_to_forward();
  up.set(svc_.config.tenant_header, tenant_);
  const std::string worker_key = svc_.config.worker_authorization();
  if (worker_key.empty()) {
    up.erase(http::field::authorization);
  } else {
    up.set(http::field::authorization, worker_key);
  }
  return true;
}

void ApiHandler::admit() {
  std::uint64_t id = 0;
  const auto verdict = admission_->admit(
      tenant_, &id,
      // Runs on the thread that released the slot: back to this session's, where the handler lives. A slot for
      // a request that waits no more (or a session gone) is given back at once.
      [admission = admission_, tenant = tenant_, weak = session_.weak_from_this(), ex = session_.executor(),
       this](std::uint64_t granted) {
        asio::post(ex, [admission, tenant, weak, this, granted] {
          auto alive = weak.lock();
          if (alive && granted == queued_) return on_admitted(granted);
          admission->release(tenant);
        });
      });
  switch (verdict) {
    case Admission::kAdmitted:
      admitted_ = true;
      return dispatch(target_path(session_.request().target()));
    case Admission::kRejected:
      svc_.metrics.admission_rejected(false);
      return session_.answer_error(make_error("too many requests: the router's queue is full, retry shortly", 429,
                                              "rate_limit_error", "queue_full"));
    case Admission::kQueued:
      break;
  }
  queued_ = id;
  session_.watch_disconnect();  // a client that leaves gives its place up (on_client_gone)
  if (!queue_timer_) queue_timer_.emplace(session_.executor());
  queue_timer_->expires_after(seconds(svc_.config.queue_timeout_s));
  queue_timer_->async_wait([this, keep = session_.keep(), id](beast::error_code ec) {
    if (!ec) on_queue_timeout(id);
  });
}

void ApiHandler::on_admitted(std::uint64_t id) {
  if (id != queued_) return;
  queued_ = 0;
  admitted_ = true;
  if (queue_timer_) queue_timer_->cancel();
  dispatch(target_path(session_.request().target()));
}

void ApiHandler::on_queue_timeout(std::uint64_t id) {
  if (id != queued_ || !admission_->cancel(id)) return;  // granted meanwhile: its wake-up is on its way
  queued_ = 0;
  svc_.metrics.admission_rejected(true);
  session_.answer_error(make_error("too many requests: no slot freed within --queue-timeout (" +
                                       fmt_seconds(svc_.config.queue_timeout_s) + "), retry shortly",
                                   429, "rate_limit_error", "queue_timeout"));
}

// The request waits no more (its client left, or the connection closes). A slot granted meanwhile comes with
// its wake-up, which finds nothing waiting and gives it back.
void ApiHandler::leave_queue() {
  if (queued_ == 0) return;
  admission_->cancel(std::exchange(queued_, 0));
  if (queue_timer_) queue_timer_->cancel();
}

void ApiHandler::release_slot() {
  if (!admitted_) return;
  admitted_ = false;
  admission_->release(tenant_);
}

}  // namespace kvroute::router::api
