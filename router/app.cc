#include "router/app.h"

#include "router/log.h"

namespace kvroute::router {

namespace {
std::chrono::milliseconds ms(double seconds) {
  return std::chrono::milliseconds(static_cast<long long>(seconds * 1000.0 + 0.5));
}
}  // namespace

App::App(boost::asio::io_context& io, Config config) : io_(io), config_(std::move(config)) {}

Result<bool> App::start() {
  policy::PolicyOptions popts;
  popts.alpha = config_.kv_cost_alpha;
  popts.beta = config_.kv_cost_beta;
  popts.session_margin_s = config_.session_margin_s;
  auto policy = policy::make_policy(config_.policy, popts);
  if (!policy) return policy.error();
  router_ = std::make_unique<Router>(config_, registry_, std::move(*policy), metrics_);
  registry_.subscribe({[this](const backends::Worker& w) {
                         const_cast<backends::Worker&>(w).set_prefill_tokens_per_s(config_.prefill_tokens_per_s);
                       },
                       nullptr});
  for (const auto& w : config_.workers) {
    auto ep = backends::parse_worker_url(w.url);
    if (!ep) return ep.error();
    ep->kv_events_endpoint = w.kv_events;
    auto id = registry_.add(*ep);
    if (!id) return id.error();
  }
  pool_ = std::make_unique<backends::UpstreamPool>(
      io_.get_executor(), backends::UpstreamPool::Options{ms(config_.connect_timeout_s), 64, std::chrono::seconds(30)});
  services_ = std::make_unique<Services>(Services{config_, registry_, *router_, *pool_, metrics_});

  auto api_ep = resolve_listen(config_.listen);
  if (!api_ep) return api_ep.error();
  auto admin_ep = resolve_listen(config_.admin_listen);
  if (!admin_ep) return admin_ep.error();
  api_ = std::make_shared<Listener>(io_, *services_, Listener::Kind::kApi);
  if (auto ok = api_->open(*api_ep); !ok) return ok.error();
  admin_ = std::make_shared<Listener>(io_, *services_, Listener::Kind::kAdmin);
  if (auto ok = admin_->open(*admin_ep); !ok) return ok.error();

  backends::HealthChecker::Options hopts;
  hopts.interval = ms(config_.health_interval_s);
  hopts.timeout = ms(config_.health_timeout_s);
  hopts.unhealthy_threshold = config_.unhealthy_threshold;
  hopts.healthy_threshold = config_.healthy_threshold;
  health_ = std::make_shared<backends::HealthChecker>(
      io_.get_executor(), registry_, hopts, [this](const backends::Worker& w, bool up) {
        if (up) {
          LOG_INFO("worker " << w.name() << " is healthy again");
        } else {
          LOG_WARN("worker " << w.name() << " failed its health checks; taken out of rotation");
          pool_->drop(w.id());
        }
        if (auto s = metrics_.worker(w.id())) s->healthy->Set(up ? 1 : 0);
      });
  health_->start();
  if (config_.metrics_interval_s > 0) {
    telemetry_ = std::make_shared<backends::TelemetryPoller>(
        io_.get_executor(), registry_, ms(config_.metrics_interval_s),
        [this](const backends::Worker& w, const backends::WorkerTelemetry& t) {
          // The engine's KV capacity, in the router's blocks, bounds what approximate mode believes it holds.
          if (t.num_gpu_blocks > 0) {
            const std::uint64_t tokens = t.num_gpu_blocks * (t.block_size ? t.block_size : config_.block_tokens);
            router_->index().set_capacity(w.id(), tokens / config_.block_tokens);
          }
          if (auto s = metrics_.worker(w.id())) s->kv_usage->Set(t.kv_usage);
        });
    telemetry_->start();
  }
  api_->run();
  admin_->run();
  LOG_INFO("kvroute listening on " << api_->local_endpoint() << " (admin " << admin_->local_endpoint() << "), policy "
                                   << config_.policy << ", " << config_.workers.size() << " workers");
  return true;
}

void App::stop() {
  if (health_) health_->stop();
  if (telemetry_) telemetry_->stop();
  if (api_) api_->stop();
  if (admin_) admin_->stop();
}

}  // namespace kvroute::router
