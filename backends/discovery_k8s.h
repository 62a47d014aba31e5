// K8sDiscovery: the workers behind one Kubernetes Service, from its EndpointSlices, followed through the API
// server's list and watch (discovery.k8s.io/v1; the slices labelled kubernetes.io/service-name=SERVICE).
//
// Unlike DNS (backends/discovery.h), EndpointSlices say which pods are ready and which are terminating, and
// name their ports. Each ready endpoint joins as http://ADDRESS:PORT (PORT: the slice port named by the
// target, else the slice's only port). An endpoint that is terminating, or no longer ready, is drained: it is
// cordoned (no new request is routed to it, requests in flight finish, its cache entries are kept should it
// become ready again). An endpoint that leaves every slice is removed. Only workers this discovery added are
// ever touched by it.
//
// The protocol is the API server's own (as client-go's reflector does it): LIST the slices, remember the list's
// resourceVersion, WATCH from it (a chunked stream of JSON lines {"type", "object"}, BOOKMARKs moving the
// version on), and when the server answers 410 Gone (the version was compacted away) list again. Other
// failures are retried with exponential backoff (0.5 s doubling to 30 s), keeping the workers as they were.
// Each request carries the service account's bearer token, read again every time (the kubelet rotates it);
// https is verified against the service account's CA.
//
//   auto api = in_cluster_api({});                    // KUBERNETES_SERVICE_HOST/PORT, token and CA files
//   auto d = std::make_shared<K8sDiscovery>(ex, registry, K8sDiscovery::Target{"llm", "vllm", "http"}, *api, log);
//   d->start();   // ... d->stop();
//
// Threading: everything runs on the discovery's strand; the registry is thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/json/fwd.hpp>

#include "backends/worker_registry.h"
#include "util/result.h"

namespace kvroute::backends {

// Where the API server is and how to authenticate to it.
struct K8sApi {
  std::string url;         // https://HOST:PORT (http:// is accepted, for tests and kubectl proxy)
  std::string token_file;  // bearer token; empty or missing: no Authorization header
  std::string ca_file;     // CA bundle that signs the API server's certificate (https)
};

// The in-cluster API (https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT, the service account's token
// and CA under /var/run/secrets/kubernetes.io/serviceaccount); each non-empty field of `overrides` wins. An
// error says what is missing (outside a pod, give --k8s-api-url).
Result<K8sApi> in_cluster_api(const K8sApi& overrides);
// The pod's own namespace (the service account's namespace file), for a target given without one.
Result<std::string> in_cluster_namespace();

// One endpoint of a slice, its conditions as the API defines them: ready and serving absent mean true,
// terminating absent means false.
struct SliceEndpoint {
  std::string address;
  bool ready = true;
  bool serving = true;
  bool terminating = false;
};

struct EndpointSlice {
  std::string name;
  std::string port;  // the chosen port, as text; empty: the slice has no such port (its endpoints are skipped)
  std::vector<SliceEndpoint> endpoints;
};

// Reads one discovery.k8s.io/v1 EndpointSlice object. `port_name` picks the port (empty: the slice's only
// port). An error names what is malformed.
Result<EndpointSlice> parse_endpoint_slice(const boost::json::value& object, std::string_view port_name);

struct K8sDiscoveryOptions {
  std::chrono::milliseconds min_backoff{500};
  std::chrono::milliseconds max_backoff{30000};
  int watch_timeout_s = 290;               // asked of the server; the watch then ends and is renewed
  std::chrono::seconds idle_timeout{330};  // no byte for this long: the connection is given up
  std::chrono::seconds connect_timeout{10};
  std::size_t max_list_bytes = std::size_t{64} << 20;
  std::size_t max_event_bytes = std::size_t{16} << 20;
};

class K8sDiscovery : public std::enable_shared_from_this<K8sDiscovery> {
 public:
  struct Target {
    std::string ns;
    std::string service;
    std::string port_name;             // empty: each slice's only port
    std::uint16_t kv_events_port = 0;  // > 0: tcp://ADDRESS:PORT is each worker's KV event publisher
    std::uint16_t replay_port = 0;
    std::string model;
  };
  using Options = K8sDiscoveryOptions;
  // What the discovery did, for the log: a worker added, drained or removed; the API failing or back.
  using Report = std::function<void(bool warning, const std::string& message)>;

  K8sDiscovery(boost::asio::any_io_executor ex, WorkerRegistry& registry, Target target, K8sApi api,
               Report report = {}, Options options = {});
  void start();
  void stop();

  // Makes the registry's workers of this service those of `slices`, by slice name (on the strand; tests).
  void apply(const std::map<std::string, EndpointSlice>& slices);
  // URLs of the workers this discovery added and has not removed, and those of them it drains.
  const std::set<std::string>& workers() const { return ours_; }
  const std::set<std::string>& draining() const { return drained_; }

 private:
  enum class WatchEnd { kRenew, kGone, kFailed };
  struct Connection;

  boost::asio::awaitable<void> run(std::shared_ptr<K8sDiscovery> self);
  boost::asio::awaitable<bool> list();
  boost::asio::awaitable<WatchEnd> watch();
  // GET `target`; the body's bytes go to on_body (with the response's status) as they arrive, until it
  // returns false. The HTTP status, or an error (resolve, connect, TLS, timeout, broken stream).
  using OnBody = std::function<bool(unsigned status, std::string_view bytes)>;
  boost::asio::awaitable<Result<unsigned>> get(const std::string& target, OnBody on_body);
  // One line of a watch stream; kRenew to go on reading.
  WatchEnd on_watch_event(std::string_view line);
  void failed(const std::string& what);
  std::string path() const;

  boost::asio::strand<boost::asio::any_io_executor> strand_;
  boost::asio::steady_timer backoff_timer_;
  WorkerRegistry& registry_;
  Target target_;
  K8sApi api_;
  Report report_;
  Options options_;
  std::shared_ptr<Connection> connection_;       // the request under way (stop() closes it)
  std::map<std::string, EndpointSlice> slices_;  // by name, as last listed and watched
  std::string resource_version_;
  std::set<std::string> ours_;     // worker URLs this discovery added
  std::set<std::string> drained_;  // of those, the ones it cordoned (terminating or not ready)
  bool failing_ = false;           // the last request failed (reported once)
  bool stopped_ = false;
};

}  // namespace kvroute::backends
