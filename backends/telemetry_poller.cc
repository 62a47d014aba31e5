#include "backends/telemetry_poller.h"

#include <boost/asio/post.hpp>

#include "backends/events/metrics_parse.h"
#include "backends/upstream.h"

namespace kvroute::backends {

namespace {
constexpr int kStaleAfterMisses = 3;

}  // namespace

WorkerTelemetry telemetry_from(const events::WorkerTelemetry& t) {
  WorkerTelemetry out;
  out.running = static_cast<std::uint32_t>(t.running.value_or(0));
  out.waiting = static_cast<std::uint32_t>(t.waiting.value_or(0));
  out.kv_usage = t.kv_usage.value_or(0);
  out.kv_usage_reported = t.kv_usage.has_value();
  out.num_gpu_blocks = t.num_gpu_blocks.value_or(0);
  out.block_size = t.block_size.value_or(0);
  out.valid = t.running || t.waiting || t.kv_usage;
  return out;
}

TelemetryPoller::TelemetryPoller(boost::asio::any_io_executor ex, WorkerRegistry& registry,
                                 std::chrono::milliseconds interval, OnUpdate on_update)
    : strand_(boost::asio::make_strand(ex)),
      timer_(strand_),
      registry_(registry),
      interval_(interval),
      on_update_(std::move(on_update)) {}

void TelemetryPoller::start() {
  boost::asio::post(strand_, [self = shared_from_this()] { self->tick(); });
}

void TelemetryPoller::stop() {
  boost::asio::post(strand_, [self = shared_from_this()] {
    self->stopped_ = true;
    self->timer_.cancel();
  });
}

void TelemetryPoller::tick() {
  if (stopped_) return;
  const auto workers = registry_.snapshot();
  for (const auto& w : *workers) poll(w);
  timer_.expires_after(interval_);
  timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
    if (!ec) self->tick();
  });
}

void TelemetryPoller::poll(std::shared_ptr<Worker> worker) {
  if (in_progress_[worker->id()]) return;
  in_progress_[worker->id()] = true;
  const auto timeout = std::max(interval_, std::chrono::milliseconds(500));
  // The requests that end from here on are not running when the report is read (WorkerTelemetry::ended_at_report).
  const std::uint64_t ended = worker->ended();
  auto on_reply = [self = shared_from_this(), worker, ended](Result<SimpleResponse> r) {
    std::optional<WorkerTelemetry> t;
    if (r && r->status == 200) {
      t = telemetry_from(events::parse_worker_telemetry(r->body));
      t->ended_at_report = ended;
    }
    boost::asio::post(self->strand_, [self, worker, t] {
      self->in_progress_[worker->id()] = false;
      if (t && t->valid) {
        self->misses_[worker->id()] = 0;
        worker->set_telemetry(*t);
        if (self->on_update_) self->on_update_(*worker, *t);
      } else if (++self->misses_[worker->id()] == kStaleAfterMisses) {
        WorkerTelemetry stale = worker->telemetry();
        stale.valid = false;  // policies fall back to router-tracked load
        worker->set_telemetry(stale);
        if (self->on_update_) self->on_update_(*worker, stale);
      }
    });
  };
  http_get(strand_, worker->endpoint(), "/metrics", timeout, std::move(on_reply));
}

}  // namespace kvroute::backends
