// HealthChecker: active health checks (GET /health) that take a worker out of rotation after
// `unhealthy_threshold` consecutive failures and bring it back after `healthy_threshold` consecutive
// successes. A failure is a connect error, a timeout or a non-2xx status.
//
//   HealthChecker hc(io.get_executor(), registry, {.interval = 2s}, [](const Worker& w, bool up) { log(...); });
//   hc.start();
//
// A worker that passes its check also has its /v1/models read: when first seen healthy, when it comes back,
// and every `models_refresh`. The ids become the worker's models (Worker::serves), so a fleet serving several
// models routes each request to the workers that serve its model.
//
// Threading: all checker state lives on its own strand; Worker::set_healthy is atomic.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>

#include "backends/worker_registry.h"

namespace kvroute::backends {

// The model ids of an OpenAI /v1/models answer ({"data": [{"id": ...}, ...]}), in its order; empty when it is
// not one.
std::vector<std::string> parse_model_ids(std::string_view body);

class HealthChecker : public std::enable_shared_from_this<HealthChecker> {
 public:
  struct Options {
    std::chrono::milliseconds interval{2000};
    std::chrono::milliseconds timeout{1000};
    int unhealthy_threshold = 2;
    int healthy_threshold = 2;
    std::string path = "/health";
    std::chrono::milliseconds models_refresh{30000};  // 0: /v1/models is not read
    std::string authorization;  // Authorization header of the /v1/models reads (workers with an API key)
  };
  using OnChange = std::function<void(const Worker&, bool healthy)>;
  using OnModels = std::function<void(const Worker&, const std::vector<std::string>& models)>;
  using OnModelsRefused = std::function<void(const Worker&, unsigned status)>;

  HealthChecker(boost::asio::any_io_executor ex, WorkerRegistry& registry, Options options, OnChange on_change);
  // Called (on the checker's strand) when a worker's models are first learned or change. Set before start().
  void on_models(OnModels f) { on_models_ = std::move(f); }
  // Called when a worker refuses /v1/models (401 or 403: it wants an API key kvroute lacks), once until it
  // answers again.
  void on_models_refused(OnModelsRefused f) { on_models_refused_ = std::move(f); }
  void start();
  void stop();
  // Reads the worker's /v1/models now (its models changed, say a LoRA adapter was loaded), then calls `done`
  // (on the checker's strand; also when the worker is gone). Any thread.
  void refresh_models(WorkerId id, std::function<void()> done);
  // Checks the worker now, out of turn, and again at once while its checks fail, until it is out of rotation or
  // passes one: for a worker whose connections the router saw break, or that outlier detection ejected. A
  // crashed worker refuses the check at once, so it is out of rotation within a few round trips instead of
  // unhealthy_threshold intervals later (where, ejected meanwhile, it would hold a place in the ejection cap).
  // At most one such check per worker per `timeout`. Any thread.
  void check_now(WorkerId id);

 private:
  struct State {
    std::uint64_t serial = 0;  // the worker's: an id reused by a new worker starts a new state
    int failures = 0;
    int successes = 0;
    bool in_progress = false;
    bool models_in_progress = false;
    bool models_refused = false;  // the last /v1/models read was refused (reported once)
    bool urgent = false;          // check_now: failed checks are repeated at once until a verdict
    std::chrono::steady_clock::time_point urgent_at{};  // last check_now acted on
    std::chrono::steady_clock::time_point models_at{};  // last read of /v1/models; epoch: never
  };
  void tick();
  State& state(const Worker& worker);
  void check(std::shared_ptr<Worker> worker);
  // `ok`: the check passed, failed, or (nullopt) could not be made for want of local resources.
  void on_result(std::shared_ptr<Worker> worker, std::optional<bool> ok);
  void read_models(std::shared_ptr<Worker> worker, std::function<void()> done = {});
  // On the strand: what a /v1/models read found (`refused`: its 401/403 status, else 0).
  void apply_models(Worker& worker, unsigned refused, std::vector<std::string> ids);

  boost::asio::strand<boost::asio::any_io_executor> strand_;
  boost::asio::steady_timer timer_;
  WorkerRegistry& registry_;
  Options options_;
  OnChange on_change_;
  OnModels on_models_;
  OnModelsRefused on_models_refused_;
  bool stopped_ = false;
  std::unordered_map<WorkerId, State> state_;  // on strand_
};

}  // namespace kvroute::backends
