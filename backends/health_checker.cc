#include "backends/health_checker.h"

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/post.hpp>

#include "backends/upstream.h"

namespace kvroute::backends {

HealthChecker::HealthChecker(boost::asio::any_io_executor ex, WorkerRegistry& registry, Options options,
                             OnChange on_change)
    : strand_(boost::asio::make_strand(ex)),
      timer_(strand_),
      registry_(registry),
      options_(std::move(options)),
      on_change_(std::move(on_change)) {}

void HealthChecker::start() {
  boost::asio::post(strand_, [self = shared_from_this()] { self->tick(); });
}

void HealthChecker::stop() {
  boost::asio::post(strand_, [self = shared_from_this()] {
    self->stopped_ = true;
    self->timer_.cancel();
  });
}

void HealthChecker::tick() {
  if (stopped_) return;
  const auto workers = registry_.snapshot();
  for (const auto& w : *workers) check(w);
  timer_.expires_after(options_.interval);
  timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
    if (!ec) self->tick();
  });
}

void HealthChecker::check(std::shared_ptr<Worker> worker) {
  State& s = state_[worker->id()];
  if (s.in_progress) return;  // a slow check is still running; its timeout will resolve it
  s.in_progress = true;
  http_get(strand_, worker->endpoint(), options_.path, options_.timeout,
           [self = shared_from_this(), worker](Result<SimpleResponse> r) {
             // Out of descriptors or memory here: no verdict on the worker (the router is what is short).
             std::optional<bool> ok;
             if (r || r.error().code != kLocalResourcesCode) ok = r && r->status >= 200 && r->status < 300;
             boost::asio::post(self->strand_, [self, worker, ok] { self->on_result(worker, ok); });
           });
}

void HealthChecker::on_result(std::shared_ptr<Worker> worker, std::optional<bool> ok) {
  State& s = state_[worker->id()];
  s.in_progress = false;
  if (!ok) return;  // no verdict
  if (*ok) {
    s.failures = 0;
    ++s.successes;
    if (!worker->healthy() && s.successes >= options_.healthy_threshold) {
      worker->set_healthy(true);
      if (on_change_) on_change_(*worker, true);
    }
  } else {
    s.successes = 0;
    ++s.failures;
    if (worker->healthy() && s.failures >= options_.unhealthy_threshold) {
      worker->set_healthy(false);
      if (on_change_) on_change_(*worker, false);
    }
  }
}

}  // namespace kvroute::backends
