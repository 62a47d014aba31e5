#include "router/app.h"

#include <boost/asio/steady_timer.hpp>
#include <boost/json.hpp>

#include "router/admin/admin_session.h"
#include "router/api/api_handler.h"
#include "router/client_session.h"
#include "router/log.h"

namespace kvroute::router {

namespace {
std::chrono::milliseconds ms(double seconds) {
  return std::chrono::milliseconds(static_cast<long long>(seconds * 1000.0 + 0.5));
}

// One API connection: the client session, answering with the API's endpoints.
void start_api_session(boost::asio::ip::tcp::socket&& socket, Services& svc, const std::shared_ptr<TlsContext>& tls) {
  ClientSession::Options options{svc.config.max_body_bytes, svc.config.client_idle_timeout_s,
                                 svc.config.header_timeout_s,  tls, svc.drain, svc.bodies, &svc.metrics};
  auto session = std::make_shared<ClientSession>(std::move(socket), std::move(options));
  session->run(std::make_unique<api::ApiHandler>(*session, svc));
}
}  // namespace

App::App(const std::vector<std::unique_ptr<boost::asio::io_context>>& contexts, Config config)
    : contexts_(contexts), io_(*contexts.front()), config_(std::move(config)) {}

Result<bool> App::start() {
  auto api_keys = load_api_keys();
  if (!api_keys) return api_keys.error();
  if (config_.max_concurrent_requests > 0) {
    admission_ = std::make_shared<Admission>(config_.max_concurrent_requests, config_.max_queued_requests);
  }
  policy::PolicyOptions popts;
  popts.alpha = config_.kv_cost_alpha;
  popts.beta = config_.kv_cost_beta;
  popts.session_margin_s = config_.session_margin_s;
  auto policy = policy::make_policy(config_.policy, popts);
  if (!policy) return policy.error();
  router_ = std::make_unique<Router>(config_, registry_, std::move(*policy), metrics_);
  metrics_.on_collect([this] { collect_metrics(); });
  watch_registry();
  for (const auto& io : contexts_) {
    pools_.push_back(std::make_unique<backends::UpstreamPool>(
        io->get_executor(), backends::UpstreamPool::Options{ms(config_.connect_timeout_s), 64, std::chrono::seconds(30)}));
  }
  if (auto ok = add_configured_workers(); !ok) return ok;
  // Router replicas: warm (the others' recent predictions, sessions, admin state) before the API listens, so
  // /ready is not answered before then.
  if (!config_.shared_state.empty()) {
    sync_ = std::make_unique<ReplicaSync>(config_, registry_, *router_, metrics_);
    if (auto ok = sync_->start(); !ok) return ok.error();
  }
  make_services(*api_keys);
  if (auto ok = open_listeners(); !ok) return ok;
  start_health();
  if (auto ok = start_discovery(); !ok) return ok;
  if (config_.metrics_interval_s > 0) {
    telemetry_ = std::make_shared<backends::TelemetryPoller>(
        io_.get_executor(), registry_, ms(config_.metrics_interval_s),
        [this](const backends::Worker& w, const backends::WorkerTelemetry& t) { on_telemetry(w, t); });
    telemetry_->start();
  }
  for (auto& l : api_) l->run();
  admin_->run();
  LOG_INFO("kvroute listening on " << api_.front()->local_endpoint() << " (admin " << admin_->local_endpoint()
                                   << "), policy " << config_.policy << ", " << config_.workers.size() << " workers"
                                   << (config_.discover.empty() && config_.discover_k8s.empty() ? "" : " plus those discovered") << ", "
                                   << contexts_.size() << " I/O threads");
  return true;
}

Result<std::shared_ptr<const ApiKeys>> App::load_api_keys() const {
  if (config_.api_keys_file.empty()) return std::shared_ptr<const ApiKeys>();
  auto keys = ApiKeys::load_file(config_.api_keys_file);
  if (!keys) return keys.error();
  LOG_INFO("client API keys: " << keys->size() << " keys from " << config_.api_keys_file);
  return std::make_shared<const ApiKeys>(std::move(*keys));
}

// A worker added starts its KV event subscriber (when it names a stream); one removed loses its pooled
// connections and its subscriber.
void App::watch_registry() {
  registry_.subscribe({[this](const backends::Worker& w) {
                         if (!w.endpoint().kv_events_endpoint.empty()) start_events(w);
                       },
                       [this](const backends::Worker& w) {
                         // Every I/O thread's pooled connections to it (its id may go to the next worker added).
                         for (auto& pool : pools_) pool->drop(w.id());
                         std::unique_ptr<events::KvEventSubscriber> sub;
                         {
                           std::lock_guard lock(events_mu_);
                           auto it = subscribers_.find(w.id());
                           if (it == subscribers_.end()) return;
                           sub = std::move(it->second);
                           subscribers_.erase(it);
                         }
                         sub.reset();  // joins its thread outside the lock
                       },
                       {}});
}

Result<bool> App::add_configured_workers() {
  for (const auto& w : config_.workers) {
    auto ep = backends::parse_worker_url(w.url);
    if (!ep) return ep.error();
    ep->kv_events_endpoint = w.kv_events;
    ep->kv_events_replay = w.kv_events_replay;
    ep->model = w.model;
    ep->dp_size = w.dp_size;
    ep->origin = backends::Origin::kConfig;
    auto id = registry_.add(*ep);
    if (!id) return id.error();
  }
  return true;
}

// One set of request-path services per I/O thread (each with its own upstream pool).
void App::make_services(const std::shared_ptr<const ApiKeys>& api_keys) {
  tokenize_cache_ = std::make_unique<TokenizeCache>(config_.tokenize_cache_entries);
  backends::OutlierDetector::Options outlier_opts;
  outlier_opts.consecutive_failures = config_.outlier_failures;
  outlier_opts.base_ejection = ms(config_.outlier_ejection_s);
  outlier_opts.max_ejection_percent = config_.outlier_max_ejection_percent;
  outliers_ = std::make_unique<backends::OutlierDetector>(
      registry_, outlier_opts, [this](const backends::Worker& w, std::chrono::steady_clock::duration lasts) {
        LOG_WARN("worker " << w.name() << " failed " << config_.outlier_failures << " requests in a row; ejected from "
                           << "rotation for " << std::chrono::duration_cast<std::chrono::seconds>(lasts).count()
                           << " s (ejection " << w.ejections() << ")");
        metrics_.ejected();
        if (health_) health_->check_now(w.id());  // a crashed worker is then out of rotation, and out of the cap
      });
  retry_budget_ = std::make_unique<RetryBudget>(
      RetryBudget::Options{config_.max_retries, config_.retry_budget_percent, RetryBudget::Options{}.min_concurrency});
  auto bodies = std::make_shared<BodyBudget>(config_.max_held_body_bytes);
  for (const auto& pool : pools_) {
    services_.push_back(std::make_unique<Services>(Services{config_, registry_, *router_, *pool, metrics_, *tokenize_cache_,
                                                            [this](hashing::WorkerId id, boost::json::object& o) {
                                                              describe_events(id, o);
                                                            },
                                                            drains_.emplace_back(std::make_shared<DrainState>()),
                                                            [this](backends::Worker& w, const std::string& why) {
                                                              if (w.mark_unhealthy()) on_health_change(w, false, why);
                                                            },
                                                            bodies,
                                                            [this](hashing::WorkerId id, std::function<void()> done) {
                                                              if (health_) return health_->refresh_models(id, std::move(done));
                                                              if (done) done();
                                                            },
                                                            admission_, api_keys, outliers_.get(), retry_budget_.get(),
                                                            [this](backends::Worker& w) {
                                                              if (health_) health_->check_now(w.id());
                                                            }}));
  }
}

void App::start_health() {
  backends::HealthChecker::Options hopts;
  hopts.interval = ms(config_.health_interval_s);
  hopts.timeout = ms(config_.health_timeout_s);
  hopts.unhealthy_threshold = config_.unhealthy_threshold;
  hopts.healthy_threshold = config_.healthy_threshold;
  hopts.authorization = config_.worker_authorization();
  health_ = std::make_shared<backends::HealthChecker>(
      io_.get_executor(), registry_, hopts,
      [this](const backends::Worker& w, bool up) { on_health_change(w, up, "failed its health checks"); });
  health_->on_models([](const backends::Worker& w, const std::vector<std::string>& models) {
    std::string list;
    for (const auto& m : models) list += (list.empty() ? "" : ", ") + m;
    LOG_INFO("worker " << w.name() << " serves " << list);
  });
  health_->on_models_refused([this](const backends::Worker& w, unsigned status) {
    LOG_WARN("worker " << w.name() << " answers " << status << " to GET /v1/models"
                       << (config_.worker_api_key.empty() ? ": it wants an API key; give kvroute --worker-api-key (or "
                                                            "KVROUTE_WORKER_API_KEY) to learn which models it serves"
                                                          : ": it refuses --worker-api-key")
                       << "; until then it is taken to serve any model");
  });
  health_->start();
}

Result<bool> App::start_discovery() {
  const auto report = [](bool warning, const std::string& message) {
    if (warning) {
      LOG_WARN(message);
    } else {
      LOG_INFO(message);
    }
  };
  for (const auto& d : config_.discover) {
    backends::DnsDiscovery::Target target{d.host, d.port, d.kv_events_port, d.replay_port, d.model};
    auto discovery = std::make_shared<backends::DnsDiscovery>(io_.get_executor(), registry_, std::move(target),
                                                              ms(config_.discover_interval_s), report);
    discovery->start();
    discovery_.push_back(std::move(discovery));
  }
  return start_k8s_discovery(report);
}

// One API listener per I/O thread, on one address, and the admin listener on the control-plane thread.
Result<bool> App::open_listeners() {
  auto api_ep = resolve_listen(config_.listen);
  if (!api_ep) return api_ep.error();
  auto admin_ep = resolve_listen(config_.admin_listen);
  if (!admin_ep) return admin_ep.error();
  // TLS: the API's certificate, and the admin listener's own or else the API's (unless --admin-tls false).
  std::shared_ptr<TlsContext> api_tls, admin_tls;
  if (!config_.tls_cert.empty() || !config_.tls_key.empty()) {
    if (config_.tls_cert.empty() || config_.tls_key.empty()) return make_error("--tls-cert and --tls-key go together");
    auto tls = TlsContext::load(config_.tls_cert, config_.tls_key);
    if (!tls) return tls.error();
    api_tls = *tls;
  }
  if (!config_.admin_tls_cert.empty() || !config_.admin_tls_key.empty()) {
    if (config_.admin_tls_cert.empty() || config_.admin_tls_key.empty()) {
      return make_error("--admin-tls-cert and --admin-tls-key go together");
    }
    auto tls = TlsContext::load(config_.admin_tls_cert, config_.admin_tls_key);
    if (!tls) return tls.error();
    admin_tls = *tls;
  } else {
    admin_tls = api_tls;
  }
  if (!config_.admin_tls) admin_tls.reset();
  for (std::size_t i = 0; i < contexts_.size(); ++i) {
    auto listener = std::make_shared<Listener>(*contexts_[i], metrics_, [svc = services_[i].get(), api_tls](auto&& socket) {
      start_api_session(std::move(socket), *svc, api_tls);
    });
    if (auto ok = listener->open(*api_ep, /*reuse_port=*/contexts_.size() > 1); !ok) return ok.error();
    *api_ep = listener->local_endpoint();  // port 0 picks a port once; the other listeners share it
    api_.push_back(std::move(listener));
  }
  admin_ = std::make_shared<Listener>(io_, metrics_, [svc = services_.front().get(), admin_tls](auto&& socket) {
    std::make_shared<admin::AdminSession>(std::move(socket), *svc, admin_tls)->run();
  });
  if (api_tls || admin_tls) {
    LOG_INFO("TLS on the " << (api_tls && admin_tls ? "API and admin listeners" : api_tls ? "API listener" : "admin listener"));
  }
  if (auto ok = admin_->open(*admin_ep, false); !ok) return ok.error();
  return true;
}

Result<bool> App::start_k8s_discovery(const backends::K8sDiscovery::Report& report) {
  if (config_.discover_k8s.empty()) return true;
  auto api = backends::in_cluster_api({config_.k8s_api_url, config_.k8s_token_file, config_.k8s_ca_file});
  if (!api) return api.error();
  for (const auto& d : config_.discover_k8s) {
    backends::K8sDiscovery::Target target{d.ns, d.service, d.port_name, d.kv_events_port, d.replay_port, d.model};
    if (target.ns.empty()) {
      auto ns = backends::in_cluster_namespace();
      if (!ns) return ns.error();
      target.ns = *ns;
    }
    LOG_INFO("discover-k8s " << target.ns << "/" << target.service << ": watching its EndpointSlices at " << api->url);
    auto discovery = std::make_shared<backends::K8sDiscovery>(io_.get_executor(), registry_, std::move(target), *api, report);
    discovery->start();
    k8s_discovery_.push_back(std::move(discovery));
  }
  return true;
}

void App::start_events(const backends::Worker& worker) {
  const hashing::WorkerId id = worker.id();
  const backends::WorkerEndpoint ep = worker.endpoint();
  if (!ep.model.empty()) return subscribe_events(id, ep, ep.model);
  // The events carry token ids but not the model: learn the worker's model (its first /v1/models entry),
  // retrying until the worker answers.
  backends::http_get(io_.get_executor(), ep, "/v1/models", std::chrono::seconds(2),
                     [this, id, ep](Result<backends::SimpleResponse> r) {
                       std::string model;
                       if (r && r->status == 200) {
                         auto ids = backends::parse_model_ids(r->body);
                         if (!ids.empty()) model = std::move(ids.front());
                       }
                       auto worker = registry_.find(id);
                       if (!worker || worker->endpoint().url != ep.url) return;  // removed meanwhile
                       if (!model.empty()) return subscribe_events(id, ep, model);
                       auto timer = std::make_shared<boost::asio::steady_timer>(io_, std::chrono::seconds(1));
                       timer->async_wait([this, timer, worker](boost::system::error_code ec) {
                         if (!ec) start_events(*worker);
                       });
                     },
                     4u << 20, config_.worker_authorization());
}

void App::subscribe_events(hashing::WorkerId id, const backends::WorkerEndpoint& ep, const std::string& model) {
  events::SubscriberOptions o;
  o.applier = events::applier_options(id, model, ep.dp_size);
  o.dp_size = ep.dp_size;
  o.applier.router_block_tokens = config_.block_tokens;
  o.endpoint = ep.kv_events_endpoint;
  o.replay_endpoint = ep.kv_events_replay;
  o.topic = config_.kv_events_topic;
  auto sub = std::make_unique<events::KvEventSubscriber>(router_->index(), o);
  sub->set_liveness_listener([this](hashing::WorkerId w, bool live, std::string_view reason) {
    on_stream_liveness(w, live, reason);
  });
  // Native streams carry load reports: telemetry without polling /metrics.
  sub->set_telemetry_listener([this](hashing::WorkerId id, const events::WorkerTelemetry& reported) {
    auto worker = registry_.find(id);
    if (!worker) return;
    backends::WorkerTelemetry t = backends::telemetry_from(reported);
    if (!t.valid) return;
    t.ended_at_report = worker->ended();  // a pushed report is as of now
    worker->set_telemetry(t);
    on_telemetry(*worker, t);
  });
  std::lock_guard lock(events_mu_);
  if (stopping_) return;
  if (auto started = sub->start(); !started) {
    LOG_ERROR("worker " << ep.name << ": KV events at " << ep.kv_events_endpoint << ": " << started.error().message
                        << "; staying in approximate mode");
    return;
  }
  LOG_INFO("worker " << ep.name << ": subscribed to KV events at " << ep.kv_events_endpoint << " (model " << model << ")");
  subscribers_[id] = std::move(sub);
}

void App::describe_events(hashing::WorkerId id, boost::json::object& o) {
  std::lock_guard lock(events_mu_);
  auto it = subscribers_.find(id);
  if (it == subscribers_.end()) return;
  const events::SubscriberStatus st = it->second->status();
  boost::json::object e;
  e["live"] = st.live;
  e["connected"] = st.connected;
  e["messages"] = st.messages;
  e["events_applied"] = st.events_applied;
  e["malformed_frames"] = st.malformed_frames;
  e["gaps"] = st.gaps;
  e["replays"] = st.replays;
  e["replay_failures"] = st.replay_failures;
  e["restarts"] = st.restarts;
  e["resets"] = st.resets;
  // Events the applier could not use: a BlockStored whose parent it never saw (joined mid-stream past the replay
  // buffer), a BlockRemoved of a block it never saw, an engine block size that is not a multiple of the router's.
  e["orphan_events"] = st.applier.orphan_events;
  e["unknown_removals"] = st.applier.unknown_removals;
  e["unsupported_events"] = st.applier.unsupported_events;
  if (!st.last_error.empty()) e["last_error"] = st.last_error;
  o["kv_events"] = std::move(e);
}

void App::on_telemetry(const backends::Worker& w, const backends::WorkerTelemetry& t) {
  // Stale (its polls failing): what it last said is no longer its load.
  if (!t.valid) return metrics_.worker_load(w.id(), std::nullopt, std::nullopt, std::nullopt);
  // The engine's KV capacity, in the router's blocks, bounds what approximate mode believes it holds, at once
  // (PrefixIndex::limit); in precise mode the worker's events say what it evicted, and the capacity is the
  // denominator of its cache's reuse share.
  if (t.num_gpu_blocks > 0) {
    const std::uint64_t tokens = t.num_gpu_blocks * (t.block_size ? t.block_size : config_.block_tokens);
    if (w.precise()) router_->index().set_capacity(w.id(), tokens / config_.block_tokens);
    else router_->index().limit(w.id(), tokens / config_.block_tokens);
  }
  metrics_.worker_load(w.id(), t.running, t.waiting, t.kv_usage_reported ? std::optional(t.kv_usage) : std::nullopt);
}

void App::collect_metrics() {
  const auto workers = registry_.snapshot();
  std::size_t healthy = 0, routable = 0;
  std::uint64_t capacity = 0;
  for (const auto& w : *workers) {
    healthy += w->healthy() ? 1 : 0;
    metrics_.sync_prefill_saved(w->id(), router_->learned_rates(w->id()).prefill_tokens_per_s);
    // Cordoned by the admin API or drained by discovery.
    if (auto s = metrics_.worker(w->id())) s->cordoned->Set(w->cordoned() ? 1 : 0);
    if (!w->routable()) continue;
    ++routable;
    capacity += router_->index().capacity(w->id());
  }
  metrics_.set_workers(workers->size(), healthy, routable);
  if (outliers_) metrics_.set_ejected(outliers_->ejected_count());
  std::uint64_t reaped = 0;
  for (const auto& pool : pools_) reaped += pool->reaped();
  metrics_.set_pool_reaped(reaped);
  metrics_.set_shared_cache(capacity, router_->cache_pools().sample_rate());
  if (admission_) metrics_.set_admission(admission_->in_flight(), admission_->queued());
  const auto now = std::chrono::system_clock::now();
  std::lock_guard lock(events_mu_);
  for (const auto& [id, sub] : subscribers_) {
    const events::SubscriberStatus st = sub->status();
    KvEventCounts c{st.messages, st.gaps, st.replays, st.malformed_frames, st.restarts, std::nullopt, st.last_batch_lag_s};
    if (st.last_message.time_since_epoch().count() != 0) {
      c.since_last_message_s = std::max(0.0, std::chrono::duration<double>(now - st.last_message).count());
    }
    metrics_.sync_kv_events(id, c);
  }
}

void App::on_stream_liveness(hashing::WorkerId id, bool live, std::string_view reason) {
  auto worker = registry_.find(id);
  if (!worker || worker->precise() == live) return;
  if (live) {
    // Predictions made while the stream was down give way to what the worker reports (the subscriber replays
    // what it missed).
    const std::size_t dropped = router_->index().drop_tier(id, hashing::Tier::kPredicted);
    LOG_INFO("worker " << worker->name() << ": precise mode (KV event stream live; " << dropped
                       << " predicted blocks dropped)");
  } else {
    LOG_WARN("worker " << worker->name() << ": approximate mode (KV event stream down: " << reason << ")");
  }
  worker->set_precise(live);
  if (auto s = metrics_.worker(id)) s->precise_mode->Set(live ? 1 : 0);
}

void App::on_health_change(const backends::Worker& w, bool up, const std::string& why) {
  if (up) {
    LOG_INFO("worker " << w.name() << " is healthy again");
  } else {
    LOG_WARN("worker " << w.name() << " " << why << "; taken out of rotation until its health checks pass");
    for (auto& pool : pools_) pool->drop(w.id());
  }
  if (auto s = metrics_.worker(w.id())) s->healthy->Set(up ? 1 : 0);
}

void App::begin_drain() {
  for (auto& d : drains_) d->draining = true;
  for (auto& l : api_) l->stop();
}

int App::in_flight() const {
  int n = 0;
  for (const auto& d : drains_) n += d->active.load();
  return n;
}

void App::stop() {
  {
    std::lock_guard lock(events_mu_);
    stopping_ = true;
  }
  for (auto& [id, sub] : subscribers_) sub->stop();
  if (sync_) sync_->stop();
  if (health_) health_->stop();
  for (auto& d : discovery_) d->stop();
  for (auto& d : k8s_discovery_) d->stop();
  if (telemetry_) telemetry_->stop();
  for (auto& l : api_) l->stop();
  if (admin_) admin_->stop();
}

}  // namespace kvroute::router
