// Two router replicas in one process, sharing state through a real redis-server: a session kv_cost binds away from
// its first turn's worker, with no warm-up going there (policy::Pick::session_worker), is known to the other replica
// from a record of the binding alone (Router::route), and that replica sends the session's next turn there.
#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "router/replica_sync.h"
#include "router/router.h"
#include "tests/support/redis_server.h"

namespace kvroute::router {
namespace {

using namespace std::chrono_literals;

// One replica: its registry of the same three workers, its router and its link to the shared state.
struct Replica {
  Replica(const std::string& redis_url, const std::string& prefix) {
    config.policy = "kv_cost";
    config.shared_state = redis_url;
    config.shared_state_prefix = prefix;
    router = std::make_unique<Router>(config, registry, std::move(*policy::make_policy("kv_cost", {})), metrics);
    for (int i = 0; i < 3; ++i) {
      auto ep = backends::parse_worker_url("http://10.0.0." + std::to_string(i + 1) + ":8000");
      EXPECT_TRUE(ep && registry.add(*ep));
    }
    sync = std::make_unique<ReplicaSync>(config, registry, *router, metrics);
    EXPECT_TRUE(sync->start());
  }
  ~Replica() { sync->stop(); }

  // A request of `session` (none: "") with a prompt of its own (`n`), routed; the caller completes it.
  Result<Decision> send(const std::string& session, int n) {
    std::string body = R"({"model":"m","max_tokens":4,"prompt":[)";
    for (int t = 0; t < 64; ++t) body += std::to_string(100000 + 1000 * n + t) + (t + 1 < 64 ? "," : "");
    body += "]}";
    auto parsed = parse_request(Endpoint::kCompletions, body, RequestHeaders{session, {}, {}}, ParseOptions{});
    EXPECT_TRUE(parsed) << parsed.error().message;
    return router->route(*parsed);
  }
  std::shared_ptr<backends::Worker> worker(hashing::WorkerId id) {
    for (const auto& w : *registry.snapshot()) {
      if (w->id() == id) return w;
    }
    return nullptr;
  }

  Config config;
  backends::WorkerRegistry registry;
  RouterMetrics metrics;
  std::unique_ptr<Router> router;
  std::unique_ptr<ReplicaSync> sync;
};

TEST(SharedSessionBinding, ASessionBoundAwayFromItsFirstTurnIsKnownToTheOtherReplica) {
  if (!test::redis_available()) GTEST_SKIP() << "redis-server is not installed (scripts/setup.sh installs it)";
  const test::Redis redis;
  const std::string prefix = "binding" + std::to_string(redis.port());
  Replica a(redis.url(), prefix), b(redis.url(), prefix);

  // Two sessions open on two workers; the third has none bound, which makes it the balance's pick for the next
  // opening.
  std::set<hashing::WorkerId> opened;
  for (int s = 0; s < 2; ++s) {
    auto d = a.send("chat-" + std::to_string(s), s);
    ASSERT_TRUE(d) << d.error().message;
    opened.insert(*a.router->session_worker("chat-" + std::to_string(s)));
    a.router->complete(*d, Outcome{true, std::nullopt});
  }
  ASSERT_EQ(opened.size(), 2u);
  hashing::WorkerId least_bound = 0;
  while (opened.count(least_bound)) ++least_bound;
  // That worker has 200K tokens of prefill queued (20 s); each worker has one request in flight, so it is no busier
  // than the mean in requests.
  for (hashing::WorkerId w = 0; w < 3; ++w) {
    a.worker(w)->begin(w == least_bound ? 200000 : 0, w == least_bound ? 20.0 : 0.0, 100);
  }

  auto first = a.send("chat-new", 10);
  ASSERT_TRUE(first) << first.error().message;
  EXPECT_NE(first->worker->id(), least_bound) << "the first turn is served where it is served soonest";
  EXPECT_EQ(first->pick.session_worker, std::optional<std::size_t>(least_bound));
  EXPECT_FALSE(first->warm_up) << "no warm-up goes to the session's worker";
  EXPECT_EQ(a.router->session_worker("chat-new"), std::optional<hashing::WorkerId>(least_bound));
  a.router->complete(*first, Outcome{true, std::nullopt});

  // The other replica hears of the binding through Redis, though nothing of the request went to that worker.
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (b.router->session_worker("chat-new") != std::optional<hashing::WorkerId>(least_bound) &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(b.router->session_worker("chat-new"), std::optional<hashing::WorkerId>(least_bound));
  auto second = b.send("chat-new", 11);
  ASSERT_TRUE(second) << second.error().message;
  EXPECT_EQ(second->worker->id(), least_bound) << "the next turn, through the other replica, goes to it";
  b.router->complete(*second, Outcome{true, std::nullopt});
}

}  // namespace
}  // namespace kvroute::router
