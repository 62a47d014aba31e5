// kv_cost's prefix hold in Router::route: a request whose matched prefix on its worker ends in a block that an
// earlier request is still computing is held until that request's first byte, the worker's KV event storing
// the block, or --prefix-hold.
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "router/router.h"

namespace kvroute::router {
namespace {

class PrefixHoldTest : public testing::Test {
 protected:
  // `queued`: a 4,096-token prompt of its own is routed first and stays in flight, so the requests after it wait
  // to start their prefills (a request whose prefix is computed by one already started is not held:
  // policy::prefix_hold_pays).
  void start(const std::string& policy, bool precise, bool queued = true) {
    config_.policy = policy;
    router_ = std::make_unique<Router>(config_, registry_, std::move(*policy::make_policy(policy, {})), metrics_);
    auto ep = backends::parse_worker_url("http://10.0.0.1:8000");
    ASSERT_TRUE(ep && registry_.add(*ep));
    registry_.find(0)->set_precise(precise);
    if (!queued) return;
    std::string body = R"({"model":"m","max_tokens":4,"prompt":[)";
    for (int t = 0; t < 4096; ++t) body += std::to_string(900000 + t) + (t + 1 < 4096 ? "," : "");
    body += "]}";
    auto parsed = parse_request(Endpoint::kCompletions, body, RequestHeaders{}, ParseOptions{});
    ASSERT_TRUE(parsed) << parsed.error().message;
    auto d = router_->route(*parsed);
    ASSERT_TRUE(d) << d.error().message;
    ahead_ = std::move(*d);
  }
  // A prompt of token ids: a 64-token prefix shared by every request (four blocks), then `tail` tokens of its own.
  Decision route(int tail, std::string_view session = {}) {
    std::string body = R"({"model":"m","max_tokens":4,"prompt":[)";
    for (int t = 0; t < 64; ++t) body += std::to_string(1000 + t) + ",";
    for (int t = 0; t < tail; ++t) body += std::to_string(5000 + 100 * tail + t) + (t + 1 < tail ? "," : "");
    body += "]}";
    auto parsed = parse_request(Endpoint::kCompletions, body, RequestHeaders{session, {}, {}}, ParseOptions{});
    EXPECT_TRUE(parsed) << parsed.error().message;
    auto d = router_->route(*parsed);
    EXPECT_TRUE(d) << d.error().message;
    return std::move(*d);
  }

  // A streamed prompt of 4,096 token ids of its own (256 blocks, one chunk): its first byte teaches the
  // worker's commit timing. `stored`: the worker's KV events have stored its blocks by then.
  void teach(bool stored, int seed) {
    std::string body = R"({"model":"m","max_tokens":4,"stream":true,"prompt":[)";
    for (int t = 0; t < 4096; ++t) body += std::to_string(100000 * seed + t) + (t + 1 < 4096 ? "," : "");
    body += "]}";
    auto parsed = parse_request(Endpoint::kCompletions, body, RequestHeaders{}, ParseOptions{});
    ASSERT_TRUE(parsed) << parsed.error().message;
    auto d = router_->route(*parsed);
    ASSERT_TRUE(d);
    ASSERT_TRUE(d->streamed);
    // The event: at once (the worker stored the blocks when it scheduled them), or with the first token after
    // the prefill.
    if (stored) router_->index().store(0, parsed->chain.hashes, hashing::Tier::kGpu);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (!stored) router_->index().store(0, parsed->chain.hashes, hashing::Tier::kGpu);
    router_->first_byte(*d);
    router_->complete(*d, Outcome{true, std::nullopt});
  }

  // Routes two requests on one prefix, checks that the second is held, lets `release` act on them, and checks
  // that the hold is over.
  void expect_released_by(const std::function<void(Decision& first, Decision& second)>& release) {
    Decision first = route(16);
    Decision second = route(32);
    ASSERT_TRUE(router_->prefix_held(second));
    release(first, second);
    EXPECT_FALSE(router_->prefix_held(second));
    complete({&first, &second});
  }

  void complete(std::initializer_list<Decision*> decisions) {
    for (Decision* d : decisions) router_->complete(*d, Outcome{true, std::nullopt});
  }

  Config config_;
  Decision ahead_;  // start(): the prompt queued ahead
  backends::WorkerRegistry registry_;
  RouterMetrics metrics_;
  std::unique_ptr<Router> router_;
};

TEST_F(PrefixHoldTest, HeldUntilTheRequestComputingItsPrefixHasItsFirstByte) {
  start("kv_cost", /*precise=*/true);
  Decision first = route(16);
  EXPECT_EQ(first.hold_leader, 0u);  // nothing was being computed
  Decision second = route(32);
  ASSERT_NE(second.hold_leader, 0u);
  EXPECT_TRUE(router_->prefix_held(second));
  Decision opening = route(48, "chat-1");
  EXPECT_NE(opening.hold_leader, 0u);  // a session's first turn is held as any request
  Decision later_turn = route(56, "chat-1");
  EXPECT_EQ(later_turn.hold_leader, 0u);  // its later turns never are
  router_->first_byte(first);
  EXPECT_FALSE(router_->prefix_held(second));
  EXPECT_FALSE(router_->prefix_held(opening));
  router_->prefix_hold_ended(second);
  EXPECT_EQ(second.hold_leader, 0u);
  complete({&first, &second, &opening, &later_turn});
}

TEST_F(PrefixHoldTest, HeldUntilTheWorkersEventStoresTheBlock) {
  start("kv_cost", true);
  expect_released_by([&](Decision&, Decision& second) {
    // The worker's KV event for the prefix's last block (the router's index moves it off the predicted tier).
    router_->index().store(0, std::vector<hashing::BlockHash>{second.hold_block}, hashing::Tier::kGpu);
  });
}

TEST_F(PrefixHoldTest, HeldAtMostPrefixHoldAndNeverWithItAtZero) {
  config_.prefix_hold_s = 0.01;
  start("kv_cost", true);
  expect_released_by([](Decision&, Decision&) { std::this_thread::sleep_for(std::chrono::milliseconds(20)); });
  config_.prefix_hold_s = 0;
  Decision a = route(16), b = route(32);
  EXPECT_EQ(b.hold_leader, 0u);
  complete({&a, &b});
}

TEST_F(PrefixHoldTest, ARequestThatEndedWithoutAFirstByteStopsTheHold) {
  start("kv_cost", true);
  Decision first = route(16);
  Decision second = route(32);
  ASSERT_TRUE(router_->prefix_held(second));
  router_->complete(first, Outcome{false, std::nullopt});  // the worker failed it
  EXPECT_FALSE(router_->prefix_held(second));
  router_->complete(second, Outcome{true, std::nullopt});
  router_->complete(ahead_, Outcome{true, std::nullopt});
  EXPECT_EQ(registry_.find(0)->in_flight(), 0u);
}

// Sent to an idle worker, the first request starts its prefill at once, and the 64-token prefix is computed in its
// first step: the engine admits the second only after that step, when the prefix is stored, so it is not held.
TEST_F(PrefixHoldTest, NotHeldOnceTheRequestComputingItsPrefixHasStarted) {
  start("kv_cost", true, /*queued=*/false);
  Decision first = route(16);
  Decision second = route(32);
  EXPECT_EQ(second.hold_leader, 0u);
  EXPECT_FALSE(router_->prefix_held(second));
  complete({&first, &second});
}

TEST_F(PrefixHoldTest, OnlyKvCostOnWorkersInPreciseModeHolds) {
  start("least_request", true);
  Decision a = route(16), b = route(32);
  EXPECT_EQ(b.hold_leader, 0u);
  complete({&a, &b});
}

TEST_F(PrefixHoldTest, NoHoldInApproximateMode) {
  start("kv_cost", false);
  Decision a = route(16), b = route(32);
  EXPECT_EQ(b.hold_leader, 0u);
  complete({&a, &b});
}

TEST_F(PrefixHoldTest, NoHoldOnAWorkerThatStoresBlocksWhenItSchedulesThem) {
  start("kv_cost", true);
  EXPECT_EQ(router_->prefix_commit(0), "unknown");
  teach(/*stored=*/true, 1);  // its event came before its first token: vLLM v1's timing
  EXPECT_EQ(router_->prefix_commit(0), "at_schedule");
  Decision first = route(16);
  Decision second = route(32);
  EXPECT_EQ(second.hold_leader, 0u);  // vLLM admits it with the first and it reads the prefix there
  complete({&first, &second});
}

TEST_F(PrefixHoldTest, HoldsGoOnOnAWorkerThatStoresBlocksAfterTheStep) {
  start("kv_cost", true);
  teach(/*stored=*/false, 1);  // its first token came before the event: SGLang's timing
  EXPECT_EQ(router_->prefix_commit(0), "after_step");
  Decision first = route(16);
  Decision second = route(32);
  EXPECT_NE(second.hold_leader, 0u);
  complete({&first, &second});
}

// The daemon sends a held request as soon as the router wakes it (router/hold_waiters.h), not at its next check.
TEST_F(PrefixHoldTest, AHeldRequestIsWokenByTheFirstByteOrTheEventItWaitsFor) {
  start("kv_cost", true);
  int woken = 0;
  Decision first = route(16);
  Decision second = route(32);
  ASSERT_TRUE(router_->prefix_held(second));
  router_->watch_prefix_hold(second, [&] { ++woken; });
  router_->index().store(0, std::vector<hashing::BlockHash>{second.hold_block + 1}, hashing::Tier::kGpu);
  EXPECT_EQ(woken, 0);  // an event for another block
  router_->first_byte(first);
  EXPECT_EQ(woken, 1);
  EXPECT_FALSE(router_->prefix_held(second));
  router_->first_byte(first);  // once only
  EXPECT_EQ(woken, 1);
  complete({&first, &second});

  Decision third = route(48);
  Decision fourth = route(64);
  ASSERT_TRUE(router_->prefix_held(fourth));
  const auto id = router_->watch_prefix_hold(fourth, [&] { ++woken; });
  router_->index().store(0, std::vector<hashing::BlockHash>{fourth.hold_block}, hashing::Tier::kGpu);
  EXPECT_EQ(woken, 2);
  EXPECT_FALSE(router_->prefix_held(fourth));
  router_->unwatch_prefix_hold(id);  // already woken: a no-op
  complete({&third, &fourth});
}

TEST(HoldWaiters, WakeOnceTheRequestsHeldForThatLeaderOrBlockOnThatWorker) {
  HoldWaiters w;
  int a = 0, b = 0, c = 0;
  w.add(/*worker=*/0, /*leader=*/7, /*block=*/100, [&] { ++a; });
  w.add(0, 8, 200, [&] { ++b; });
  const auto gone = w.add(1, 7, 100, [&] { ++c; });
  EXPECT_EQ(w.size(), 3u);
  w.leader_done(0, 7);
  EXPECT_EQ(a, 1);
  EXPECT_EQ(c, 0);  // another worker's request 7
  w.leader_done(0, 7);
  EXPECT_EQ(a, 1);  // once
  const hashing::BlockHash stored[] = {150, 200};
  w.stored(0, stored);
  EXPECT_EQ(b, 1);
  w.remove(gone);
  w.leader_done(1, 7);
  EXPECT_EQ(c, 0);
  EXPECT_EQ(w.size(), 0u);
}

}  // namespace
}  // namespace kvroute::router
