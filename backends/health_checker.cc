#include "backends/health_checker.h"

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/post.hpp>
#include <boost/json.hpp>

#include "backends/upstream.h"

namespace kvroute::backends {

std::vector<std::string> parse_model_ids(std::string_view body) {
  std::vector<std::string> ids;
  boost::system::error_code ec;
  const boost::json::value v = boost::json::parse(body, ec);
  if (ec || !v.is_object()) return ids;
  const auto* data = v.as_object().if_contains("data");
  if (!data || !data->is_array()) return ids;
  for (const auto& m : data->as_array()) {
    const auto* id = m.is_object() ? m.as_object().if_contains("id") : nullptr;
    if (id && id->is_string() && !id->as_string().empty()) ids.emplace_back(id->as_string());
  }
  return ids;
}

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

HealthChecker::State& HealthChecker::state(const Worker& worker) {
  State& s = state_[worker.id()];
  if (s.serial != worker.serial()) {
    s = State{};
    s.serial = worker.serial();
  }
  return s;
}

void HealthChecker::check(std::shared_ptr<Worker> worker) {
  State& s = state(*worker);
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
  if (worker->removed()) return;  // its id may be another worker's by now
  State& s = state(*worker);
  s.in_progress = false;
  if (!ok) {  // no verdict
    s.urgent = false;
    return;
  }
  if (*ok) {
    s.urgent = false;
    s.failures = 0;
    ++s.successes;
    bool back = false;
    if (!worker->healthy() && s.successes >= options_.healthy_threshold) {
      worker->set_healthy(true);
      back = true;
      if (on_change_) on_change_(*worker, true);
    }
    // A worker that comes back may be another deployment (another model) on the same address.
    const auto now = std::chrono::steady_clock::now();
    if (options_.models_refresh.count() > 0 && !s.models_in_progress &&
        (back || s.models_at == std::chrono::steady_clock::time_point{} || now - s.models_at >= options_.models_refresh)) {
      read_models(worker);
    }
  } else {
    s.successes = 0;
    ++s.failures;
    if (worker->healthy() && s.failures >= options_.unhealthy_threshold) {
      worker->set_healthy(false);
      if (on_change_) on_change_(*worker, false);
    }
    if (s.urgent && worker->healthy() && !stopped_) return check(worker);
    s.urgent = false;
  }
}

void HealthChecker::apply_models(Worker& worker, unsigned refused, std::vector<std::string> ids) {
  if (worker.removed()) return;
  State& s = state(worker);
  s.models_in_progress = false;
  if (refused && !s.models_refused && on_models_refused_) on_models_refused_(worker, refused);
  s.models_refused = refused != 0;
  if (ids.empty() || ids == worker.models()) return;
  worker.set_models(ids);
  if (on_models_) on_models_(worker, ids);
}

void HealthChecker::refresh_models(WorkerId id, std::function<void()> done) {
  boost::asio::post(strand_, [self = shared_from_this(), id, done = std::move(done)]() mutable {
    auto worker = self->registry_.find(id);
    if (self->stopped_ || !worker || worker->removed()) {
      if (done) done();
      return;
    }
    self->read_models(std::move(worker), std::move(done));
  });
}

void HealthChecker::check_now(WorkerId id) {
  boost::asio::post(strand_, [self = shared_from_this(), id] {
    auto worker = self->registry_.find(id);
    if (self->stopped_ || !worker || worker->removed() || !worker->healthy()) return;
    State& s = self->state(*worker);
    const auto now = std::chrono::steady_clock::now();
    if (s.urgent || now - s.urgent_at < self->options_.timeout) return;
    s.urgent = true;
    s.urgent_at = now;
    self->check(std::move(worker));  // a check under way already: its result is acted on as urgent
  });
}

void HealthChecker::read_models(std::shared_ptr<Worker> worker, std::function<void()> done) {
  State& s = state(*worker);
  s.models_in_progress = true;
  s.models_at = std::chrono::steady_clock::now();  // a worker without /v1/models is asked again at the refresh
  http_get(
      strand_, worker->endpoint(), "/v1/models", options_.timeout,
      [self = shared_from_this(), worker, done = std::move(done)](Result<SimpleResponse> r) mutable {
        std::vector<std::string> ids;
        if (r && r->status == 200) ids = parse_model_ids(r->body);
        const unsigned refused = r && (r->status == 401 || r->status == 403) ? r->status : 0;
        boost::asio::post(self->strand_, [self, worker, refused, ids = std::move(ids), done = std::move(done)]() mutable {
          self->apply_models(*worker, refused, std::move(ids));
          if (done) done();
        });
      },
      4u << 20, options_.authorization);
}

}  // namespace kvroute::backends
