// DnsDiscovery's bookkeeping, fed resolution results directly (the resolver itself is exercised end to end by
// tests/e2e/router_e2e_test.cc, DiscoveredWorkersServe).
#include "backends/discovery.h"

#include <boost/asio/io_context.hpp>
#include <gtest/gtest.h>

namespace kvroute::backends {
namespace {

std::set<std::string> registered(const WorkerRegistry& reg) {
  std::set<std::string> urls;
  const auto workers = reg.snapshot();
  for (const auto& w : *workers) urls.insert(w->endpoint().url);
  return urls;
}

TEST(DnsDiscovery, FollowsTheAddressesAndLeavesOtherWorkersAlone) {
  boost::asio::io_context io;
  WorkerRegistry reg;
  ASSERT_TRUE(reg.add(*parse_worker_url("http://10.0.0.9:8000")));  // configured with --worker
  std::vector<std::string> log;
  auto d = std::make_shared<DnsDiscovery>(io.get_executor(), reg, DnsDiscovery::Target{"vllm", "8000", 5557, 5558, "m"},
                                          std::chrono::seconds(5),
                                          [&](bool warning, const std::string& m) { log.push_back((warning ? "W " : "I ") + m); });

  d->apply({}, {"10.0.0.1", "10.0.0.2", "10.0.0.2", "10.0.0.9"});  // a duplicate, and the configured worker
  EXPECT_EQ(registered(reg), (std::set<std::string>{"http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.9:8000"}));
  EXPECT_EQ(d->workers(), (std::set<std::string>{"http://10.0.0.1:8000", "http://10.0.0.2:8000"}));
  const auto w1 = reg.find_by_url("http://10.0.0.1:8000");
  ASSERT_TRUE(w1);
  EXPECT_EQ(w1->endpoint().kv_events_endpoint, "tcp://10.0.0.1:5557");
  EXPECT_EQ(w1->endpoint().kv_events_replay, "tcp://10.0.0.1:5558");
  EXPECT_EQ(w1->endpoint().model, "m");

  // A failed resolution changes nothing and is reported once.
  d->apply(boost::asio::error::host_not_found, {});
  d->apply(boost::asio::error::host_not_found, {});
  EXPECT_EQ(registered(reg).size(), 3u);
  EXPECT_EQ(std::count_if(log.begin(), log.end(), [](const std::string& m) { return m.starts_with("W "); }), 1);

  // Scaled: 10.0.0.1 is gone, 10.0.0.3 and an IPv6 pod are new; the configured worker stays even unresolved.
  d->apply({}, {"10.0.0.2", "10.0.0.3", "fd00::7"});
  EXPECT_EQ(registered(reg), (std::set<std::string>{"http://10.0.0.2:8000", "http://10.0.0.3:8000", "http://[fd00::7]:8000",
                                                    "http://10.0.0.9:8000"}));
  EXPECT_EQ(reg.find_by_url("http://[fd00::7]:8000")->endpoint().kv_events_endpoint, "tcp://[fd00::7]:5557");
  EXPECT_FALSE(reg.find_by_url("http://10.0.0.1:8000"));
  EXPECT_TRUE(w1->removed());  // requests still in flight to it finish; nothing new reaches it

  // A discovered worker removed by hand (the admin API) stays out until its address leaves and comes back.
  reg.remove(reg.find_by_url("http://10.0.0.3:8000")->id());
  d->apply({}, {"10.0.0.2", "10.0.0.3", "fd00::7"});
  EXPECT_FALSE(reg.find_by_url("http://10.0.0.3:8000"));
  d->apply({}, {"10.0.0.2", "fd00::7"});
  d->apply({}, {"10.0.0.2", "10.0.0.3", "fd00::7"});
  EXPECT_TRUE(reg.find_by_url("http://10.0.0.3:8000"));

  // Scaled to zero.
  d->apply({}, {});
  EXPECT_EQ(registered(reg), (std::set<std::string>{"http://10.0.0.9:8000"}));
  EXPECT_TRUE(d->workers().empty());
}

}  // namespace
}  // namespace kvroute::backends
