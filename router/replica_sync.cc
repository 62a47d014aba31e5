#include "router/replica_sync.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>

#include <boost/json.hpp>

#include "router/log.h"

namespace kvroute::router {

using backends::Origin;
using shared_state::AdminChange;

ReplicaSync::ReplicaSync(const Config& config, backends::WorkerRegistry& registry, Router& router,
                         RouterMetrics& metrics)
    : config_(config), registry_(registry), router_(router), metrics_(metrics) {}

ReplicaSync::~ReplicaSync() { stop(); }

Result<bool> ReplicaSync::start() {
  auto url = shared_state::parse_redis_url(config_.shared_state);
  if (!url) return url.error();
  // A password kept out of the command line (a Kubernetes Secret as an environment variable).
  if (url->password.empty()) {
    if (const char* p = std::getenv("KVROUTE_SHARED_STATE_PASSWORD"); p && *p) url->password = p;
  }
  display_url_ = url->display();
  shared_state::SharedState::Options o;
  o.url = *url;
  o.prefix = config_.shared_state_prefix;
  o.session_ttl_s = config_.session_ttl_s;
  o.load_interval = std::chrono::milliseconds(std::max<long long>(1, std::llround(config_.shared_state_interval_s * 1000)));
  o.load_ttl = std::max(std::chrono::milliseconds(1000), 40 * o.load_interval);
  state_ = std::make_unique<shared_state::SharedState>(o, *this);
  registry_.subscribe({[this](const backends::Worker& w) { on_added(w); },
                       [this](const backends::Worker& w) { on_removed(w); },
                       [this](const backends::Worker& w, bool c, Origin by) { on_cordon(w, c, by); }});
  router_.set_shared_state(state_.get());
  const auto t0 = std::chrono::steady_clock::now();
  const bool warm = state_->start(std::chrono::seconds(5));
  const auto status = state_->status();
  if (warm) {
    LOG_INFO("shared state " << display_url_ << " (prefix " << config_.shared_state_prefix << "): replica "
                             << status.replica << " warm in "
                             << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << " s, "
                             << status.applied << " records of other replicas applied, " << status.replicas
                             << " other replicas busy");
  }
  publish_metrics();
  return true;
}

void ReplicaSync::stop() {
  if (!state_) return;
  router_.set_shared_state(nullptr);  // (the router outlives this; in-flight requests stop publishing)
  state_->stop();
}

boost::json::object shared_state_json(const shared_state::SharedState::Status& s) {
  boost::json::object o;
  o["url"] = s.url;
  o["prefix"] = s.prefix;
  o["up"] = s.up;
  o["replica"] = s.replica;
  o["replicas"] = s.replicas;
  o["rank"] = s.rank;
  o["stream_delay_s"] = s.stream_delay_s;
  o["queued"] = s.queued;
  o["published"] = s.published;
  o["dropped"] = s.dropped;
  o["applied"] = s.applied;
  o["resyncs"] = s.resyncs;
  if (!s.last_error.empty()) o["last_error"] = s.last_error;
  return o;
}

void ReplicaSync::publish_metrics() {
  const auto s = state_->status();
  metrics_.shared_state(s.up, s.replicas, s.published, s.dropped, s.applied, s.resyncs);
}

// ---- outbound: the operator's changes ----

void ReplicaSync::on_added(const backends::Worker& w) {
  if (w.endpoint().origin == Origin::kOperator && state_) publish_added(w);
}

void ReplicaSync::publish_added(const backends::Worker& w) {
  const auto& ep = w.endpoint();
  state_->admin({AdminChange::Kind::kAdd, ep.url,
                 shared_state::encode_attrs({{"kv_events", ep.kv_events_endpoint},
                                             {"kv_events_replay", ep.kv_events_replay},
                                             {"model", ep.model},
                                             {"dp_size", ep.dp_size > 1 ? std::to_string(ep.dp_size) : ""}})});
}

void ReplicaSync::on_removed(const backends::Worker& w) {
  if (w.removed_by() != Origin::kOperator || !state_) return;
  state_->admin({AdminChange::Kind::kRemove, w.endpoint().url, ""});
}

void ReplicaSync::on_cordon(const backends::Worker& w, bool cordoned, Origin by) {
  if (by == Origin::kShared) {
    // The admin API sets the gauge of its own changes; the others' are applied here.
    if (auto s = metrics_.worker(w.id())) s->cordoned->Set(cordoned ? 1 : 0);
    return;
  }
  if (by != Origin::kOperator || !state_) return;
  state_->admin({cordoned ? AdminChange::Kind::kCordon : AdminChange::Kind::kUncordon, w.endpoint().url, ""});
}

// ---- inbound ----

void ReplicaSync::apply_routed(const shared_state::Routed& r) {
  if (r.hashes.empty()) return;
  auto w = registry_.find_by_url(r.worker);
  if (!w) return;  // unknown here
  // In precise mode the worker's events say what it holds, but only once it has computed it: until then the
  // others expect the chain as the sender does.
  if (w->precise()) return router_.expect_elsewhere(w->id(), r.hashes, r.computes_from);
  router_.index().record(w->id(), r.hashes);
}

void ReplicaSync::apply_session(std::uint64_t session, const std::string& worker) {
  if (auto w = registry_.find_by_url(worker)) router_.adopt_session(session, w->id());
}

void ReplicaSync::apply_response_owner(const std::string& id, const std::string& worker) {
  if (id.empty()) return;
  if (auto w = registry_.find_by_url(worker)) router_.adopt_response(id, w->id());
}

void ReplicaSync::apply_prefix_computed(const std::string& worker, hashing::BlockHash last) {
  if (auto w = registry_.find_by_url(worker)) router_.computed_elsewhere(w->id(), last);
}

void ReplicaSync::add_shared_worker(const std::string& url, const std::string& attrs) {
  if (registry_.find_by_url(url)) return;
  auto ep = backends::parse_worker_url(url);
  if (!ep) {
    LOG_WARN("shared state: worker '" << url << "' added elsewhere is not usable here: " << ep.error().message);
    return;
  }
  for (const auto& [k, v] : shared_state::decode_attrs(attrs)) {
    if (k == "kv_events") ep->kv_events_endpoint = v;
    else if (k == "kv_events_replay") ep->kv_events_replay = v;
    else if (k == "model") ep->model = v;
    else if (k == "dp_size") ep->dp_size = static_cast<std::uint32_t>(std::clamp(std::atoi(v.c_str()), 1, 1024));
  }
  ep->origin = Origin::kShared;
  if (registry_.add(*ep)) LOG_INFO("worker " << ep->name << " added through another router replica");
}

void ReplicaSync::apply_admin(const AdminChange& c) {
  if (c.kind == AdminChange::Kind::kAdd) return add_shared_worker(c.worker, c.attrs);
  auto w = registry_.find_by_url(c.worker);
  if (!w) return;
  if (c.kind == AdminChange::Kind::kRemove) {
    if (registry_.remove(w->id(), Origin::kShared)) LOG_INFO("worker " << w->name() << " removed through another router replica");
    return;
  }
  const bool cordon = c.kind == AdminChange::Kind::kCordon;
  if (w->cordoned() == cordon) return;
  w->set_cordoned(cordon, Origin::kShared);
  LOG_INFO("worker " << w->name() << (cordon ? " cordoned" : " uncordoned") << " through another router replica");
}

void ReplicaSync::apply_admin_state(const shared_state::AdminState& s) {
  if (s.fresh) {
    // Redis came back empty: write this replica's cordons and run-time workers back, so that neither a
    // replica starting now nor the others lose them.
    const auto workers = registry_.snapshot();
    for (const auto& w : *workers) {
      if (w->endpoint().origin == Origin::kOperator || w->endpoint().origin == Origin::kShared) publish_added(*w);
      if (w->cordoned()) state_->admin({AdminChange::Kind::kCordon, w->endpoint().url, ""});
    }
    return;
  }
  for (const auto& [url, attrs] : s.added) add_shared_worker(url, attrs);
  for (const auto& url : s.removed) {
    if (s.added.count(url)) continue;
    if (auto w = registry_.find_by_url(url); w && registry_.remove(w->id(), Origin::kShared)) {
      LOG_INFO("worker " << w->name() << " stays removed (removed through the admin API of a router replica)");
    }
  }
  const auto workers = registry_.snapshot();
  for (const auto& w : *workers) {
    const bool cordon = std::find(s.cordoned.begin(), s.cordoned.end(), w->endpoint().url) != s.cordoned.end();
    if (w->cordoned() == cordon) continue;
    w->set_cordoned(cordon, Origin::kShared);
    LOG_INFO("worker " << w->name() << (cordon ? " cordoned" : " uncordoned") << " as the shared admin state says");
  }
}

void ReplicaSync::apply_rates(const std::string& worker, const policy::WorkerRates& r) {
  if (auto w = registry_.find_by_url(worker)) router_.seed_rates(w->id(), r);
}

void ReplicaSync::apply_remote_load(std::vector<shared_state::WorkerLoad> load) {
  std::vector<Router::RemoteLoad> by_id;
  const double as_of_s = load.empty() ? 0 : load.front().at;  // shared_state::wire::queued_at: one time for all
  if (!load.empty()) {
    const auto workers = registry_.snapshot();
    for (const auto& l : load) {
      auto it = std::find_if(workers->begin(), workers->end(), [&](const auto& w) { return w->endpoint().url == l.worker; });
      if (it == workers->end()) continue;
      const auto id = (*it)->id();
      if (id >= by_id.size()) by_id.resize(id + 1u);
      by_id[id] = l.share();
    }
  }
  router_.set_remote_load(std::move(by_id), as_of_s);
  if (state_) publish_metrics();
}

std::vector<shared_state::WorkerLoad> ReplicaSync::local_load() {
  std::vector<shared_state::WorkerLoad> out;
  const auto workers = registry_.snapshot();
  const auto now = std::chrono::steady_clock::now();
  for (const auto& w : *workers) {
    if (w->in_flight() == 0) continue;
    const policy::WorkerView v = w->view(now);
    // The time without a first token only while prefills are queued here (policy::LoadShare::prefill_elapsed_s).
    out.push_back({w->endpoint().url, v.in_flight, v.pending_prefill_tokens, v.pending_prefill_s, v.oldest_prefill_s,
                   v.active_decode_tokens, 0.0, v.pending_prefill_tokens > 0 ? v.prefill_elapsed_s : 0.0,
                   v.inflight_kv_tokens});
  }
  return out;
}

std::vector<std::pair<std::string, policy::WorkerRates>> ReplicaSync::local_rates() {
  std::vector<std::pair<std::string, policy::WorkerRates>> out;
  const auto workers = registry_.snapshot();
  for (const auto& w : *workers) out.emplace_back(w->endpoint().url, router_.learned_rates(w->id()));
  return out;
}

std::vector<std::pair<std::string, std::uint64_t>> ReplicaSync::local_ended() {
  std::vector<std::pair<std::string, std::uint64_t>> out;
  const auto workers = registry_.snapshot();
  for (const auto& w : *workers) {
    if (w->ended_here() > 0) out.emplace_back(w->endpoint().url, w->ended_here());
  }
  return out;
}

void ReplicaSync::apply_others_ended(const std::vector<std::pair<std::string, std::uint64_t>>& ended) {
  const std::map<std::string_view, std::uint64_t> by_url(ended.begin(), ended.end());
  const auto workers = registry_.snapshot();
  for (const auto& w : *workers) {
    if (auto it = by_url.find(w->endpoint().url); it != by_url.end()) w->set_others_ended(it->second);
  }
}

void ReplicaSync::up_changed(bool up, const std::string& why) {
  if (up) {
    LOG_INFO("shared state " << display_url_ << " is up: sharing with the other router replicas (resynchronized)");
  } else {
    LOG_WARN("shared state " << display_url_ << " is down (" << why
                             << "): this replica routes alone and reconnects with backoff");
  }
  if (state_) publish_metrics();
}

}  // namespace kvroute::router
