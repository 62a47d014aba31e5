#include "backends/worker_registry.h"

#include <algorithm>

#include "util/steady_seconds.h"

namespace kvroute::backends {

Result<WorkerEndpoint> parse_worker_url(std::string_view url) {
  WorkerEndpoint ep;
  ep.url = std::string(url);
  std::string_view rest = url;
  if (rest.starts_with("http://")) {
    rest.remove_prefix(7);
  } else if (rest.find("://") != std::string_view::npos) {
    return make_error("worker URL '" + ep.url + "': only http:// is supported");
  }
  if (auto slash = rest.find('/'); slash != std::string_view::npos) {
    if (rest.substr(slash) != "/") return make_error("worker URL '" + ep.url + "': must not have a path");
    rest = rest.substr(0, slash);
  }
  std::string_view host, port;
  if (rest.starts_with("[")) {
    auto close = rest.find(']');
    if (close == std::string_view::npos) return make_error("worker URL '" + ep.url + "': unterminated '['");
    host = rest.substr(1, close - 1);
    if (close + 1 < rest.size() && rest[close + 1] == ':') port = rest.substr(close + 2);
  } else {
    auto colon = rest.rfind(':');
    host = rest.substr(0, colon);
    if (colon != std::string_view::npos) port = rest.substr(colon + 1);
  }
  if (host.empty()) return make_error("worker URL '" + ep.url + "': missing host");
  if (port.empty()) port = "80";
  if (!std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; }) || port.size() > 5 ||
      std::stoul(std::string(port)) == 0 || std::stoul(std::string(port)) > 65535) {
    return make_error("worker URL '" + ep.url + "': port must be a number from 1 to 65535");
  }
  ep.host = std::string(host);
  ep.port = std::string(port);
  ep.name = (rest.starts_with("[") ? "[" + ep.host + "]" : ep.host) + ":" + ep.port;
  ep.url = "http://" + ep.name;
  return ep;
}

std::uint64_t Worker::begin(std::uint64_t uncached, double prefill_s, std::uint64_t kv_tokens) {
  in_flight_.fetch_add(1, std::memory_order_relaxed);
  inflight_kv_.fetch_add(kv_tokens, std::memory_order_relaxed);
  pending_prefill_.fetch_add(uncached, std::memory_order_relaxed);
  std::lock_guard lock(prefill_mu_);
  const std::uint64_t ticket = next_ticket_++;
  prefill_queue_.add(ticket, prefill_s, steady_seconds(std::chrono::steady_clock::now()));
  publish_prefill_queue();
  return ticket;
}

void Worker::leave_prefill_queue(std::uint64_t ticket, bool first_token) {
  std::lock_guard lock(prefill_mu_);
  prefill_queue_.remove(ticket, first_token, steady_seconds(std::chrono::steady_clock::now()));
  publish_prefill_queue();
}

void Worker::publish_prefill_queue() {
  prefill_total_s_.store(prefill_queue_.total_s(), std::memory_order_relaxed);
  prefill_oldest_s_.store(prefill_queue_.empty() ? -1.0 : prefill_queue_.oldest_s(), std::memory_order_relaxed);
  prefill_since_s_.store(prefill_queue_.since(), std::memory_order_relaxed);
}

void Worker::first_token(std::uint64_t ticket, std::uint64_t uncached, std::uint64_t context) {
  pending_prefill_.fetch_sub(uncached, std::memory_order_relaxed);
  active_decode_.fetch_add(context, std::memory_order_relaxed);
  leave_prefill_queue(ticket, /*first_token=*/true);
}

void Worker::end(std::uint64_t ticket, bool had_first_token, std::uint64_t uncached, std::uint64_t context,
                 std::uint64_t kv_tokens) {
  in_flight_.fetch_sub(1, std::memory_order_relaxed);
  ended_.fetch_add(1, std::memory_order_relaxed);
  inflight_kv_.fetch_sub(kv_tokens, std::memory_order_relaxed);
  if (had_first_token) {
    active_decode_.fetch_sub(context, std::memory_order_relaxed);
  } else {
    pending_prefill_.fetch_sub(uncached, std::memory_order_relaxed);
    leave_prefill_queue(ticket, /*first_token=*/false);
  }
}

void Worker::set_cordoned(bool c, Origin by) {
  if (cordoned_.exchange(c, std::memory_order_relaxed) == c) return;
  if (cordon_hook_) cordon_hook_(*this, c, by);
}

void Worker::set_telemetry(const WorkerTelemetry& t) {
  std::lock_guard lock(mu_);
  telemetry_ = t;
}

WorkerTelemetry Worker::telemetry() const {
  std::lock_guard lock(mu_);
  return telemetry_;
}

void Worker::set_models(std::vector<std::string> models) {
  std::lock_guard lock(mu_);
  if (models == models_) return;
  models_ = std::move(models);
  models_version_.fetch_add(1, std::memory_order_release);
}

std::vector<std::string> Worker::models() const {
  std::lock_guard lock(mu_);
  return models_;
}

bool Worker::serves(std::string_view model) const {
  std::lock_guard lock(mu_);
  return models_.empty() || std::find(models_.begin(), models_.end(), model) != models_.end();
}

policy::WorkerView Worker::view(std::chrono::steady_clock::time_point now) const {
  policy::WorkerView v;
  v.id = id_;
  v.healthy = healthy() && !ejected(now);  // an ejected worker takes no new request (outlier_detector.h)
  v.in_flight = in_flight();
  v.pending_prefill_tokens = pending_prefill_.load(std::memory_order_relaxed);
  v.active_decode_tokens = active_decode_.load(std::memory_order_relaxed);
  v.inflight_kv_tokens = inflight_kv_.load(std::memory_order_relaxed);
  if (const double oldest = prefill_oldest_s_.load(std::memory_order_relaxed); oldest >= 0) {
    v.pending_prefill_s = prefill_total_s_.load(std::memory_order_relaxed);
    v.oldest_prefill_s = oldest;
    v.prefill_elapsed_s = std::max(0.0, steady_seconds(now) - prefill_since_s_.load(std::memory_order_relaxed));
  }
  const WorkerTelemetry t = telemetry();
  if (t.valid) {
    v.running = t.running;
    v.waiting = t.waiting;
    policy::settle_report(v, ended(), t.ended_at_report);
    v.kv_usage = t.kv_usage;
    v.capacity_blocks = t.num_gpu_blocks;
  }
  return v;
}

Result<WorkerId> WorkerRegistry::add(WorkerEndpoint endpoint) {
  std::shared_ptr<Worker> added;
  std::vector<Listener> listeners;
  {
    std::lock_guard lock(mu_);
    std::vector<bool> used;
    for (const auto& w : *workers_) {
      if (w->endpoint().url == endpoint.url) return make_error("worker " + endpoint.url + " is already registered");
      if (w->id() >= used.size()) used.resize(w->id() + 1u, false);
      used[w->id()] = true;
    }
    WorkerId id = 0;
    while (id < used.size() && used[id]) ++id;
    if (id == 0xffff) return make_error("too many workers (at most 65535)");
    added = std::make_shared<Worker>(id, std::move(endpoint), next_serial_++);
    // The registry outlives the workers' cordon changes: only the admin API and the shared state make them,
    // and both are torn down before it.
    added->cordon_hook_ = [this](const Worker& w, bool c, Origin by) { notify_cordon(w, c, by); };
    auto next = std::make_shared<WorkerList>(*workers_);
    next->push_back(added);
    workers_ = std::move(next);
    listeners = listeners_;
  }
  for (const auto& l : listeners) {
    if (l.added) l.added(*added);
  }
  return added->id();
}

void WorkerRegistry::notify_cordon(const Worker& w, bool cordoned, Origin by) {
  std::vector<Listener> listeners;
  {
    std::lock_guard lock(mu_);
    listeners = listeners_;
  }
  for (const auto& l : listeners) {
    if (l.cordon_changed) l.cordon_changed(w, cordoned, by);
  }
}

bool WorkerRegistry::remove(WorkerId id, Origin by) {
  std::shared_ptr<Worker> removed;
  std::vector<Listener> listeners;
  {
    std::lock_guard lock(mu_);
    auto next = std::make_shared<WorkerList>(*workers_);
    auto it = std::find_if(next->begin(), next->end(), [id](const auto& w) { return w->id() == id; });
    if (it == next->end()) return false;
    removed = *it;
    removed->set_removed(by);
    next->erase(it);
    workers_ = std::move(next);
    listeners = listeners_;
  }
  for (const auto& l : listeners) {
    if (l.removed) l.removed(*removed);
  }
  return true;
}

void WorkerRegistry::subscribe(Listener l) {
  std::lock_guard lock(mu_);
  listeners_.push_back(std::move(l));
}

std::shared_ptr<const WorkerList> WorkerRegistry::snapshot() const {
  std::lock_guard lock(mu_);
  return workers_;
}

std::shared_ptr<Worker> WorkerRegistry::find(WorkerId id) const {
  auto snap = snapshot();
  for (const auto& w : *snap) {
    if (w->id() == id) return w;
  }
  return nullptr;
}

std::shared_ptr<Worker> WorkerRegistry::find_by_url(std::string_view url) const {
  auto snap = snapshot();
  for (const auto& w : *snap) {
    if (w->endpoint().url == url) return w;
  }
  return nullptr;
}

std::shared_ptr<Worker> WorkerRegistry::find_by_name(std::string_view name_or_id) const {
  auto snap = snapshot();
  for (const auto& w : *snap) {
    if (w->name() == name_or_id || std::to_string(w->id()) == name_or_id) return w;
  }
  return nullptr;
}

void WorkerRegistry::fill_views(const WorkerList& workers, std::vector<policy::WorkerView>& out) {
  out.clear();
  out.reserve(workers.size());
  const auto now = std::chrono::steady_clock::now();
  for (const auto& w : workers) out.push_back(w->view(now));
}

}  // namespace kvroute::backends
