// ReplicaSync: joins this router replica to the others through the shared state (--shared-state, Redis;
// backends/shared_state/shared_state.h, architecture section 11).
//
// Outbound, nothing here is on the request path: Router::route() publishes what it routed and bound, and
// Router::remember_response() the response owners, each a non-blocking enqueue. The operator's admin changes are
// heard at the registry (its listeners, and Worker::set_cordoned() with Origin::kOperator), so whichever front
// end made them, they reach the others and Redis's admin state. Inbound, on the shared state's thread: the
// others' predictions go into the prefix index as this replica's own (in precise mode as expected blocks, until
// the worker's events confirm them, and as computing there, for prefix holds), their bindings and owners into the router's maps, their admin changes into
// the registry (Origin::kShared, so they are not sent back), their learned rates into workers not yet learned
// here, and their load (published every interval, plus each routed record's share until then) into what
// route() prices. Workers are named by URL: ids are per replica.
//
//   ReplicaSync sync(config, registry, router, metrics);
//   if (auto ok = sync.start(); !ok) fail(ok.error().message);   // after the configured workers are added
//   ... serve ...
//   sync.stop();
#pragma once

#include <memory>

#include <boost/json/object.hpp>

#include "backends/shared_state/shared_state.h"
#include "backends/worker_registry.h"
#include "router/config.h"
#include "router/metrics.h"
#include "router/router.h"

namespace kvroute::router {

// {"url", "prefix", "up", "replica", "replicas", "rank", "stream_delay_s", "queued", "published", "dropped",
// "applied", "resyncs", "last_error"} for the admin API: `if (auto s = router.shared_state_status())
// out["shared_state"] = shared_state_json(*s);`
boost::json::object shared_state_json(const shared_state::SharedState::Status& s);

class ReplicaSync final : public shared_state::Handler {
 public:
  ReplicaSync(const Config& config, backends::WorkerRegistry& registry, Router& router, RouterMetrics& metrics);
  ~ReplicaSync() override;

  // Connects and waits (at most a few seconds) for the recent stream and the admin state before returning, so
  // the replica is warm when it starts serving. Redis unreachable is not an error: the replica starts alone.
  Result<bool> start();
  void stop();

  // shared_state::Handler (the shared state's thread)
  void apply_routed(const shared_state::Routed& r) override;
  void apply_session(std::uint64_t session, const std::string& worker) override;
  void apply_response_owner(const std::string& id, const std::string& worker) override;
  void apply_prefix_computed(const std::string& worker, hashing::BlockHash last) override;
  void apply_admin(const shared_state::AdminChange& c) override;
  void apply_admin_state(const shared_state::AdminState& s) override;
  void apply_rates(const std::string& worker, const policy::WorkerRates& r) override;
  void apply_remote_load(std::vector<shared_state::WorkerLoad> load) override;
  std::vector<shared_state::WorkerLoad> local_load() override;
  std::vector<std::pair<std::string, policy::WorkerRates>> local_rates() override;
  std::vector<std::pair<std::string, std::uint64_t>> local_ended() override;
  void apply_others_ended(const std::vector<std::pair<std::string, std::uint64_t>>& ended) override;
  void up_changed(bool up, const std::string& why) override;

 private:
  // The admin API's change, for the others (registry listeners).
  void on_added(const backends::Worker& w);
  void publish_added(const backends::Worker& w);
  void on_removed(const backends::Worker& w);
  void on_cordon(const backends::Worker& w, bool cordoned, backends::Origin by);
  void add_shared_worker(const std::string& url, const std::string& attrs);
  void publish_metrics();

  const Config& config_;
  backends::WorkerRegistry& registry_;
  Router& router_;
  RouterMetrics& metrics_;
  std::string display_url_;
  std::unique_ptr<shared_state::SharedState> state_;
};

}  // namespace kvroute::router
