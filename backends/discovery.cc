#include "backends/discovery.h"

#include <boost/asio/post.hpp>

namespace kvroute::backends {

namespace asio = boost::asio;

Result<WorkerEndpoint> discovered_endpoint(const std::string& address, const std::string& port,
                                           std::uint16_t kv_events_port, std::uint16_t replay_port,
                                           const std::string& model) {
  const bool v6 = address.find(':') != std::string::npos;
  const std::string host = v6 ? "[" + address + "]" : address;
  auto ep = parse_worker_url("http://" + host + ":" + port);
  if (!ep) return ep;
  if (kv_events_port > 0) ep->kv_events_endpoint = "tcp://" + host + ":" + std::to_string(kv_events_port);
  if (replay_port > 0) ep->kv_events_replay = "tcp://" + host + ":" + std::to_string(replay_port);
  ep->model = model;
  ep->origin = Origin::kDiscovery;
  return ep;
}

DnsDiscovery::DnsDiscovery(asio::any_io_executor ex, WorkerRegistry& registry, Target target,
                           std::chrono::milliseconds interval, Report report, Resolve resolve)
    : strand_(asio::make_strand(ex)),
      timer_(strand_),
      resolver_(strand_),
      registry_(registry),
      target_(std::move(target)),
      interval_(interval),
      report_(std::move(report)),
      resolve_(std::move(resolve)) {
  if (!report_) report_ = [](bool, const std::string&) {};
  if (!resolve_) {
    resolve_ = [this](const Target& t, std::function<void(boost::system::error_code, std::vector<std::string>)> done) {
      resolver_.async_resolve(t.host, t.port, [done = std::move(done)](boost::system::error_code ec,
                                                                        asio::ip::tcp::resolver::results_type results) {
        std::vector<std::string> addresses;
        for (const auto& r : results) addresses.push_back(r.endpoint().address().to_string());
        done(ec, std::move(addresses));
      });
    };
  }
}

void DnsDiscovery::start() {
  asio::post(strand_, [self = shared_from_this()] { self->tick(); });
}

void DnsDiscovery::stop() {
  asio::post(strand_, [self = shared_from_this()] {
    self->stopped_ = true;
    self->timer_.cancel();
    self->resolver_.cancel();
  });
}

void DnsDiscovery::tick() {
  if (stopped_) return;
  resolve_(target_, [self = shared_from_this()](boost::system::error_code ec, std::vector<std::string> addresses) {
    asio::post(self->strand_, [self, ec, addresses = std::move(addresses)] {
      if (self->stopped_) return;
      self->apply(ec, addresses);
      self->timer_.expires_after(self->interval_);
      self->timer_.async_wait([self](boost::system::error_code wait_ec) {
        if (!wait_ec) self->tick();
      });
    });
  });
}

void DnsDiscovery::apply(boost::system::error_code ec, const std::vector<std::string>& addresses) {
  const std::string name = target_.host + ":" + target_.port;
  if (ec) {
    if (!failing_) {
      report_(true, "discover " + name + ": " + ec.message() + "; keeping its " + std::to_string(ours_.size()) +
                        " workers until it resolves again");
    }
    failing_ = true;
    return;
  }
  if (failing_) report_(false, "discover " + name + ": resolves again");
  failing_ = false;
  std::set<std::string> wanted;
  std::vector<WorkerEndpoint> added;
  for (const auto& address : addresses) {
    auto ep = discovered_endpoint(address, target_.port, target_.kv_events_port, target_.replay_port, target_.model);
    if (!ep) continue;
    if (!wanted.insert(ep->url).second || ours_.count(ep->url)) continue;
    added.push_back(std::move(*ep));
  }
  for (auto& ep : added) {
    const std::string url = ep.url;
    if (auto id = registry_.add(std::move(ep)); id) {
      ours_.insert(url);
      report_(false, "discover " + name + ": worker " + url + " added");
    }  // else configured already (e.g. also given with --worker): not ours to manage
  }
  for (auto it = ours_.begin(); it != ours_.end();) {
    if (wanted.count(*it)) {
      ++it;
      continue;
    }
    if (auto w = registry_.find_by_url(*it)) registry_.remove(w->id(), Origin::kDiscovery);
    report_(false, "discover " + name + ": worker " + *it + " removed (no longer resolved)");
    it = ours_.erase(it);
  }
}

}  // namespace kvroute::backends
