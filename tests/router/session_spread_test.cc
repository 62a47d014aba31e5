// kv_cost opens each new session on a worker with the fewest live sessions bound (Router::count_sessions): the
// bindings are counted per worker as they are made, moved, evicted for --max-sessions and expired; between workers
// bound alike, on the one whose last session opened longest ago.
#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "router/router.h"

namespace kvroute::router {
namespace {

class SessionSpreadTest : public testing::Test {
 protected:
  void start(std::size_t workers) {
    config_.policy = "kv_cost";
    router_ = std::make_unique<Router>(config_, registry_, std::move(*policy::make_policy("kv_cost", {})), metrics_);
    for (std::size_t i = 0; i < workers; ++i) {
      auto ep = backends::parse_worker_url("http://10.0.0." + std::to_string(i + 1) + ":8000");
      ASSERT_TRUE(ep && registry_.add(*ep));
    }
  }
  // One turn: a prompt of a 256-token prefix every request shares, then a few tokens of its own; routed and
  // completed at once, so no worker has a request in flight when the next one is routed. Returns the worker it
  // went to, or with a session the session's worker.
  // `own`: how many tokens of its own the prompt has after the shared prefix.
  hashing::WorkerId turn(std::string_view session, int n, int own = 16) {
    std::string body = R"({"model":"m","max_tokens":4,"prompt":[)";
    for (int t = 0; t < 256; ++t) body += std::to_string(1000 + t) + ",";
    for (int t = 0; t < own; ++t) body += std::to_string(100000 + 10000 * n + t) + (t + 1 < own ? "," : "");
    body += "]}";
    auto parsed = parse_request(Endpoint::kCompletions, body, RequestHeaders{session, {}, {}}, ParseOptions{});
    EXPECT_TRUE(parsed) << parsed.error().message;
    auto d = router_->route(*parsed);
    EXPECT_TRUE(d) << d.error().message;
    router_->complete(*d, Outcome{true, std::nullopt});
    // An opening may be served by its prefix's holder and bound elsewhere (policy::Pick::session_worker), where a
    // warm-up copies the prompt: answered at once too. The session's worker is where it opened.
    if (d->warm_up) router_->warm_up_done(*d->warm_up, /*answered=*/true);
    if (session.empty()) return d->worker->id();
    const hashing::WorkerId bound_to = router_->session_worker(std::string(session)).value();
    if (!d->pick.session_worker) {
      EXPECT_EQ(bound_to, d->worker->id());
    }
    return bound_to;
  }
  std::map<hashing::WorkerId, std::uint32_t> bound() {
    std::map<hashing::WorkerId, std::uint32_t> out;
    for (hashing::WorkerId w = 0; w < 3; ++w) out[w] = router_->sessions_bound(w);
    return out;
  }

  Config config_;
  backends::WorkerRegistry registry_;
  RouterMetrics metrics_;
  std::unique_ptr<Router> router_;
};

// A worker holding the prefix every session starts with is the cheapest for each first turn, and idle between
// them; the sessions still spread evenly (a holder takes one only while it has no more than the mean), since
// their later turns will stay where they open.
TEST_F(SessionSpreadTest, NewSessionsSpreadEvenlyThoughOneWorkerHoldsTheirPrefix) {
  start(3);
  const hashing::WorkerId holder = turn("", 0);
  EXPECT_EQ(turn("", 1), holder);  // without a session, the cached prefix wins
  std::map<hashing::WorkerId, int> opened;
  for (int s = 0; s < 6; ++s) ++opened[turn("chat-" + std::to_string(s), 10 + s)];
  EXPECT_EQ(opened, (std::map<hashing::WorkerId, int>{{0, 2}, {1, 2}, {2, 2}}));
  EXPECT_EQ(bound(), (std::map<hashing::WorkerId, std::uint32_t>{{0, 2}, {1, 2}, {2, 2}}));
  // Later turns stay, and count once.
  const hashing::WorkerId first = router_->session_worker("chat-0").value();
  EXPECT_EQ(turn("chat-0", 20), first);
  EXPECT_EQ(router_->sessions_bound(first), 2u);
}

// With as many sessions bound everywhere, a new session opens where the last session opened longest ago
// (Router::bind_session keeps when each worker last had one bound anew): openings go round the fleet in turn,
// whatever the workers' costs and later turns of the sessions already open.
TEST_F(SessionSpreadTest, OpeningsGoRoundTheWorkersInTurn) {
  start(3);
  std::vector<hashing::WorkerId> first_round;
  for (int s = 0; s < 3; ++s) first_round.push_back(turn("r1-" + std::to_string(s), s));
  EXPECT_EQ(bound(), (std::map<hashing::WorkerId, std::uint32_t>{{0, 1}, {1, 1}, {2, 1}}));
  EXPECT_EQ(turn("r1-2", 10), first_round[2]);  // a later turn is no opening
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(turn("r2-" + std::to_string(s), 20 + s), first_round[s]) << "opening " << s << " of the second round";
  }
}

// Once later turns show what sessions keep of their own beyond the shared prefix, a session opens on a holder of
// that prefix with more sessions than the mean while those excess sessions' own contexts (taken at the largest
// seen) take less KV than a copy of the prefix: here 20 tokens of their own against a 256-token prefix.
// Sessions whose later turns carry far more of their own than the prefix spread as before.
class SharedPrefixSessionTest : public SessionSpreadTest {
 protected:
  // Two sessions open (the second copies the prefix: its holder has more than the mean, 1/3), the first has 20
  // later turns with `own` tokens of its own each, and a third opens: whether on one of the prefix's two holders.
  bool third_opens_on_a_holder(int own) {
    start(3);
    const hashing::WorkerId first = turn("a", 0);
    const hashing::WorkerId second = turn("b", 1);
    EXPECT_NE(second, first);
    for (int n = 0; n < 20; ++n) EXPECT_EQ(turn("a", 100 + n, own), first);
    const hashing::WorkerId third = turn("c", 2);
    return third == first || third == second;
  }
};

TEST_F(SharedPrefixSessionTest, ASessionOpensOnTheHolderWhileSessionsAddLittleToThePrefix) {
  EXPECT_TRUE(third_opens_on_a_holder(16));  // excess 1/3 x 20 tokens < 256
}

TEST_F(SharedPrefixSessionTest, SessionsThatKeepMoreThanThePrefixStillSpread) {
  EXPECT_FALSE(third_opens_on_a_holder(2000));  // 1/3 x ~2000 tokens > 256: the worker with no session
}

// A binding another replica re-makes after it expired here (Router::adopt_session), before anything dropped it,
// is an opening on its worker, as a new binding is: the next session opens where the last opening was longest ago,
// not on that worker.
TEST_F(SessionSpreadTest, ABindingAdoptedAfterItExpiredCountsAsAnOpening) {
  config_.session_ttl_s = 1.0;
  start(3);
  const hashing::WorkerId wa = turn("a", 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  const hashing::WorkerId wb = turn("b", 1);
  const hashing::WorkerId wc = turn("c", 2);
  ASSERT_EQ((std::set<hashing::WorkerId>{wa, wb, wc}).size(), 3u);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // "a" idle past the TTL, "b" and "c" not
  router_->adopt_session(Router::session_hash("a"), wa);
  EXPECT_EQ(bound(), (std::map<hashing::WorkerId, std::uint32_t>{{0, 1}, {1, 1}, {2, 1}}));
  EXPECT_EQ(turn("d", 3), wb);  // wb's opening is now the oldest; wa's was the adoption
}

TEST_F(SessionSpreadTest, EvictedAndExpiredBindingsNoLongerCount) {
  config_.max_sessions = 3;
  config_.session_ttl_s = 0.3;
  start(3);
  for (int s = 0; s < 3; ++s) turn("a-" + std::to_string(s), s);
  EXPECT_EQ(bound(), (std::map<hashing::WorkerId, std::uint32_t>{{0, 1}, {1, 1}, {2, 1}}));
  // A fourth binding evicts the least recently used one: three bindings still, wherever they are.
  turn("a-3", 3);
  EXPECT_FALSE(router_->session_worker("a-0"));
  std::uint32_t total = 0;
  for (auto [w, n] : bound()) total += n;
  EXPECT_EQ(total, 3u);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  EXPECT_EQ(bound(), (std::map<hashing::WorkerId, std::uint32_t>{{0, 0}, {1, 0}, {2, 0}}));
  EXPECT_EQ(router_->session_count(), 0u);
}

}  // namespace
}  // namespace kvroute::router
