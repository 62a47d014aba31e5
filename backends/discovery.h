// DnsDiscovery: the workers behind one DNS name, kept in the registry as the name's addresses come and go.
//
// A Kubernetes headless Service resolves to the addresses of its ready pods, so resolving it again every few
// seconds follows a worker pool through scaling and restarts without restarting the router or rendering its
// config again. Each address becomes the worker http://ADDRESS:PORT (with its KV event endpoints when a port
// for them is configured); an address that is no longer returned is removed, which lets requests in flight
// to it finish. Only workers this discovery added are ever removed by it. A failed resolution changes
// nothing (health checks take dead workers out meanwhile) and is logged once until a resolution succeeds.
//
//   auto d = std::make_shared<DnsDiscovery>(ex, registry, target, std::chrono::seconds(5), log_it);
//   d->start();   // ... d->stop();
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>

#include "backends/worker_registry.h"

namespace kvroute::backends {

// The worker at a discovered ADDRESS (IPv4 or IPv6, unbracketed) and PORT: http://ADDRESS:PORT, with its KV
// event publisher and replay socket at the given ports of the same address when they are > 0.
Result<WorkerEndpoint> discovered_endpoint(const std::string& address, const std::string& port,
                                           std::uint16_t kv_events_port, std::uint16_t replay_port,
                                           const std::string& model);

class DnsDiscovery : public std::enable_shared_from_this<DnsDiscovery> {
 public:
  struct Target {
    std::string host;
    std::string port;
    std::uint16_t kv_events_port = 0;  // > 0: tcp://ADDRESS:PORT is each worker's KV event publisher
    std::uint16_t replay_port = 0;
    std::string model;
  };
  // Resolves the target's host; the callback gets the addresses (as text) or an error. The default resolves
  // through the system resolver; tests pass their own.
  using Resolve =
      std::function<void(const Target&, std::function<void(boost::system::error_code, std::vector<std::string>)>)>;
  // What the discovery did, for the log: a worker added or removed, a name that stopped or started resolving.
  using Report = std::function<void(bool warning, const std::string& message)>;

  DnsDiscovery(boost::asio::any_io_executor ex, WorkerRegistry& registry, Target target,
               std::chrono::milliseconds interval, Report report = {}, Resolve resolve = {});
  void start();
  void stop();

  // Makes the registry's workers of this name those of `addresses` (runs on the caller's thread: tests).
  void apply(boost::system::error_code ec, const std::vector<std::string>& addresses);
  // URLs of the workers this discovery added and has not removed.
  const std::set<std::string>& workers() const { return ours_; }

 private:
  void tick();

  boost::asio::strand<boost::asio::any_io_executor> strand_;
  boost::asio::steady_timer timer_;
  boost::asio::ip::tcp::resolver resolver_;
  WorkerRegistry& registry_;
  Target target_;
  std::chrono::milliseconds interval_;
  Report report_;
  Resolve resolve_;
  std::set<std::string> ours_;  // worker URLs this discovery added
  bool failing_ = false;        // the last resolution failed (logged once)
  bool stopped_ = false;
};

}  // namespace kvroute::backends
