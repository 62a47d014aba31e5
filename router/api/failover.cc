// Failover of routed inference requests: a worker that fails a request before any byte of it reached the
// client (a refused or reset connection, a 502, 503 or 504 answer, no head within --first-byte-timeout) has
// the request sent to another worker, never back to one that failed it, at most --max-retries times and
// within the retry budget (router/retry_budget.h: Envoy's, at most 20 % of the requests in flight are
// retries, at least 3). POST inference is safe to send again: a worker that failed it returned nothing, and a
// completion has no effect beyond its answer (a stored /v1/responses response the client never learnt of is
// only an orphan the worker expires).
#include <algorithm>

#include "router/api/api_handler.h"
#include "router/log.h"

namespace kvroute::router::api {

namespace {

// The requests in flight, for the retry budget: what the router has sent to the workers and not seen end.
std::size_t active_requests(const backends::WorkerRegistry& registry) {
  const auto workers = registry.snapshot();
  std::size_t n = 0;
  for (const auto& w : *workers) n += w->in_flight();
  return n;
}

}  // namespace

// Whether a failure now would be retried: a routed request, retries left, room in the budget, and another
// worker it could go to.
bool ApiHandler::retry_possible() {
  if (!decision_ || !routable_ || !svc_.retries || reroutes_ >= svc_.config.max_retries) return false;
  if (svc_.retries->active() >= svc_.retries->limit(active_requests(svc_.registry))) return false;
  const auto workers = svc_.registry.snapshot();
  return std::any_of(workers->begin(), workers->end(), [&](const auto& w) {
    return w.get() != decision_->worker.get() && w->routable() &&
           std::find(tried_.begin(), tried_.end(), w->id()) == tried_.end();
  });
}

// A worker that failed the request before its first byte computed none of it: what routing predicted it would
// hold is forgotten. Approximate mode records the routed chain on the worker at once, so a worker answering
// every request 503 at once would otherwise look like the one holding every prefix sent to it, and draw them
// (precise mode drops its unconfirmed predictions at the request's end anyway).
void ApiHandler::forget_predicted_prefix() {
  if (!decision_ || !routable_ || decision_->worker->precise() || decision_->worker->removed()) return;
  svc_.router.index().drop_unconfirmed(decision_->worker->id(), routable_->chain.hashes);
}

bool ApiHandler::retry_elsewhere(const ExchangeFailure& failure) {
  if (!retry_possible()) {
    if (decision_ && routable_ && svc_.retries && reroutes_ < svc_.config.max_retries &&
        svc_.retries->active() >= svc_.retries->limit(active_requests(svc_.registry))) {
      svc_.metrics.retry_budget_exhausted();
    }
    return false;
  }
  auto ticket = svc_.retries->try_acquire(active_requests(svc_.registry));
  if (!ticket) {
    svc_.metrics.retry_budget_exhausted();
    return false;
  }
  ++reroutes_;
  tried_.push_back(decision_->worker->id());
  svc_.metrics.retried(failure.kind);
  LOG_INFO("request " << session_.request_id() << ": sent to another worker (retry " << reroutes_ << " of "
                      << svc_.config.max_retries << ")");
  exchange_.hold_retry(std::move(*ticket));
  route_again();
  return true;
}

}  // namespace kvroute::router::api
