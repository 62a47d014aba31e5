#include <cmath>
#include <limits>
#include <map>
#include <set>

#include <gtest/gtest.h>

#include "policy/policies.h"
#include "policy/burst_stagger.h"
#include "policy/prefill_queue.h"
#include "policy/rate_learner.h"
#include "policy/recent_quantile.h"
#include "policy/routing_policy.h"

namespace kvroute::policy {
namespace {

// A hand-built routing situation: n workers, a 1000-token prompt of 10 blocks (100 tokens per block).
struct Scene {
  std::vector<WorkerView> workers;
  hashing::BlockChain chain;
  hashing::PrefixIndex::Match match;
  RoutingContext ctx;

  explicit Scene(std::size_t n) {
    workers.resize(n);
    for (std::size_t i = 0; i < n; ++i) workers[i].id = static_cast<WorkerId>(i);
    chain.hashes.assign(10, 0);
    match.blocks.assign(n, 0);
    match.cpu_blocks.assign(n, 0);
  }
  const RoutingContext& context() {
    ctx.chain = &chain;
    ctx.tokens_per_block = 100;
    ctx.prompt_tokens = 1000;
    ctx.workers = workers;
    ctx.match = &match;
    ctx.affinity_key = "model\0hello";
    return ctx;
  }
};

std::unique_ptr<RoutingPolicy> make(const std::string& name) {
  auto p = make_policy(name, PolicyOptions{});
  EXPECT_TRUE(p) << name;
  return std::move(*p);
}

// kv_cost's pick from a policy that has seen no request before: no rent paid on any prefix yet (rent or buy,
// policy/kv_cost.cc), so the pick is the cheapest worker's.
std::optional<Pick> fresh_kv_cost_pick(const RoutingContext& ctx, const PolicyOptions& o = {}) {
  return (*make_policy("kv_cost", o))->pick(ctx);
}

// The worker a session opening binds its session to: where its later turns go (Pick::session_worker when the first
// turn goes elsewhere).
std::size_t binds(const std::optional<Pick>& pick) { return pick->session_worker.value_or(pick->worker); }

TEST(PolicyFactory, AllTenNamesAndAClearErrorForOthers) {
  EXPECT_EQ(policy_names().size(), 10u);
  for (const auto& n : policy_names()) {
    auto p = make_policy(n, PolicyOptions{});
    ASSERT_TRUE(p) << n;
    EXPECT_EQ((*p)->name(), n);
  }
  auto bad = make_policy("fastest", PolicyOptions{});
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("kv_cost"), std::string::npos);
}

TEST(Policies, EveryPolicySkipsUnhealthyAndReturnsNoneWhenAllAreDown) {
  for (const auto& n : policy_names()) {
    auto p = make(n);
    Scene s(3);
    s.workers[0].healthy = false;
    s.workers[2].healthy = false;
    s.match.blocks = {10, 0, 10};  // the best matches are on unhealthy workers
    for (std::uint64_t seq = 0; seq < 20; ++seq) {
      s.ctx.sequence = seq;
      s.ctx.random = seq * 0x9E3779B97F4A7C15ull;
      auto pick = p->pick(s.context());
      ASSERT_TRUE(pick) << n;
      EXPECT_EQ(pick->worker, 1u) << n;
    }
    s.workers[1].healthy = false;
    EXPECT_FALSE(p->pick(s.context())) << n;
  }
}

// settle_report: ends since the report leave the report's total, and the running places they free are refilled
// from the waiting line; never below zero, and a count that did not grow changes nothing.
TEST(WorkerViewReport, RequestsThatEndedSinceTheReportAreNoLongerRunning) {
  WorkerView v;
  v.running = 3;
  v.waiting = 2;
  policy::settle_report(v, 14, 10);
  EXPECT_EQ(v.running, 1u);  // 4 of the 5 reported ended: one is left, running
  EXPECT_EQ(v.waiting, 0u);
  v.running = 3;
  v.waiting = 0;
  policy::settle_report(v, 11, 10);
  EXPECT_EQ(v.running, 2u);
  policy::settle_report(v, 5, 10);
  EXPECT_EQ(v.running, 2u);
}

TEST(RoundRobin, RotatesOverHealthyWorkers) {
  auto p = make("round_robin");
  Scene s(3);
  std::vector<std::size_t> got;
  for (std::uint64_t seq = 0; seq < 6; ++seq) {
    s.ctx.sequence = seq;
    got.push_back(p->pick(s.context())->worker);
  }
  EXPECT_EQ(got, (std::vector<std::size_t>{0, 1, 2, 0, 1, 2}));
}

TEST(LeastRequest, PicksFewestInFlight) {
  auto p = make("least_request");
  Scene s(3);
  s.workers[0].in_flight = 5;
  s.workers[1].in_flight = 2;
  s.workers[2].in_flight = 9;
  EXPECT_EQ(p->pick(s.context())->worker, 1u);
}

TEST(PowerOfTwo, TakesTheLighterOfTwoDraws) {
  auto p = make("power_of_two");
  Scene s(2);
  s.workers[0].in_flight = 7;
  s.workers[1].in_flight = 1;
  for (std::uint64_t r = 0; r < 10; ++r) {
    s.ctx.random = r * 0x1234567887654321ull;
    EXPECT_EQ(p->pick(s.context())->worker, 1u);
  }
}

TEST(Random, CoversAllWorkers) {
  auto p = make("random");
  Scene s(4);
  std::set<std::size_t> seen;
  for (std::uint64_t r = 0; r < 200; ++r) {
    s.ctx.random = r * 0x9E3779B97F4A7C15ull + 12345;
    seen.insert(p->pick(s.context())->worker);
  }
  EXPECT_EQ(seen.size(), 4u);
}

TEST(CacheAware, BestMatchAboveThresholdElseLeastLoaded) {
  auto p = make("cache_aware");
  Scene s(3);
  s.match.blocks = {0, 5, 1};  // 50 % match on worker 1
  s.workers[1].in_flight = 3;
  auto pick = p->pick(s.context());
  EXPECT_EQ(pick->worker, 1u);
  EXPECT_EQ(pick->reason, Reason::kPrefixHit);
  EXPECT_EQ(pick->predicted_cached_tokens, 500u);
  s.match.blocks = {0, 2, 1};  // 20 % is below the 0.3 threshold: least loaded
  s.workers[0].in_flight = 1;
  s.workers[2].in_flight = 0;
  EXPECT_EQ(p->pick(s.context())->worker, 2u);
}

TEST(CacheAware, ImbalanceOverridesTheMatch) {
  auto p = make("cache_aware");
  Scene s(2);
  s.match.blocks = {10, 0};
  s.workers[0].in_flight = 100;  // 100 - 10 > 64 and 100 > 1.5 x 10
  s.workers[1].in_flight = 10;
  auto pick = p->pick(s.context());
  EXPECT_EQ(pick->worker, 1u);
  EXPECT_EQ(pick->reason, Reason::kLoadFallback);
}

TEST(Chwbl, SameKeySameWorkerUntilOverloaded) {
  auto p = make("chwbl");
  Scene s(4);
  const std::size_t first = p->pick(s.context())->worker;
  for (int i = 0; i < 5; ++i) EXPECT_EQ(p->pick(s.context())->worker, first);
  s.workers[first].in_flight = 10;  // mean load (10+1)/4 -> bound ceil(1.25 * 2.75) = 4
  EXPECT_NE(p->pick(s.context())->worker, first);
  // Different keys spread over workers.
  std::set<std::size_t> seen;
  s.workers[first].in_flight = 0;
  std::vector<std::string> keys;
  for (int k = 0; k < 64; ++k) keys.push_back("m" + std::to_string(k));
  for (const auto& key : keys) {
    s.context();
    s.ctx.affinity_key = key;
    seen.insert(p->pick(s.ctx)->worker);
  }
  EXPECT_EQ(seen.size(), 4u);
}

TEST(BlockCost, FewestNewBlocksPlusActiveBlocks) {
  auto p = make("block_cost");
  Scene s(2);
  s.match.blocks = {8, 0};                 // worker 0 would prefill 2 blocks, worker 1 all 10
  s.workers[0].active_decode_tokens = 500;  // +5 active blocks
  EXPECT_EQ(p->pick(s.context())->worker, 0u);
  s.workers[0].active_decode_tokens = 1500;  // 2 + 15 > 10 + 0
  EXPECT_EQ(p->pick(s.context())->worker, 1u);
}

TEST(WeightedScorers, PrefixWeighsTwice) {
  auto p = make("weighted_scorers");
  Scene s(2);
  s.match.blocks = {10, 0};
  s.workers[0].kv_usage = 0.9;
  s.workers[0].waiting = 4;  // worst queue: queue score 0; kv 0.1; prefix 2 -> 2.1 vs 0 + 1 + 1
  EXPECT_EQ(p->pick(s.context())->worker, 0u);
  s.match.blocks = {3, 0};  // 0.6 + 0.1 + 0 < 2
  EXPECT_EQ(p->pick(s.context())->worker, 1u);
}

TEST(E2, ExploitsWhenCachedExceedsUncached) {
  auto p = make("e2");
  Scene s(3);
  s.match.blocks = {6, 7, 0};
  s.workers[1].in_flight = 4;
  auto pick = p->pick(s.context());
  EXPECT_EQ(pick->worker, 0u);  // both hold more than half; 0 is less loaded
  EXPECT_EQ(pick->reason, Reason::kPrefixHit);
  s.match.blocks = {4, 0, 0};  // no worker holds more than half: explore by load cost
  s.workers[0].pending_prefill_tokens = 100000;
  EXPECT_EQ(p->pick(s.context())->worker, 2u);
}

TEST(KvCost, PrefersCachedPrefixUntilQueueingCostsMore) {
  auto p = make("kv_cost");
  Scene s(2);
  for (auto& w : s.workers) w.prefill_tokens_per_s = 1000;  // 1 s per 1000 tokens
  s.match.blocks = {8, 0};
  auto pick = p->pick(s.context());
  EXPECT_EQ(pick->worker, 0u);
  EXPECT_EQ(pick->reason, Reason::kPrefixHit);
  // 200 uncached tokens after 800 cached ones, priced with their attention context (policy/rate_learner.h).
  EXPECT_NEAR(pick->estimate_s, prefill_seconds(200, 800, 1000), 1e-9);
  EXPECT_EQ(pick->predicted_cached_tokens, 800u);
  s.workers[0].pending_prefill_tokens = 5000;  // 5 s of queued prefill beats a 1 s cold prefill
  pick = p->pick(s.context());
  EXPECT_EQ(pick->worker, 1u);
  EXPECT_EQ(pick->reason, Reason::kLoadFallback);
}

TEST(KvCost, LeavesThePrefixHolderOnlyWhileTheFleetHasSpareCapacity) {
  auto p = make("kv_cost");
  Scene s(3);
  for (auto& w : s.workers) {
    w.prefill_tokens_per_s = 1000;
    w.capacity_blocks = 1000;  // caches four fifths full of blocks hit again: a copied block sets off 4 recomputes
    w.reused_blocks = 800;
  }
  s.match.blocks = {8, 0, 0};
  s.workers[0].pending_prefill_tokens = 5000;  // the holder has 5 s of prefill queued
  // Workers 1 and 2 idle: recomputing the 800 cached tokens on one of them costs less than the wait.
  EXPECT_EQ(p->pick(s.context())->worker, 1u);
  // Every worker has a queue (the shortest is 0.3 s, fifteen decode steps of 20 ms): a copy of the prefix would take
  // GPU time from other requests, so the request waits for its holder.
  s.workers[1].pending_prefill_tokens = 300;
  s.workers[2].pending_prefill_tokens = 400;
  auto pick = p->pick(s.context());
  EXPECT_EQ(pick->worker, 0u);
  EXPECT_EQ(pick->reason, Reason::kPrefixHit);
  // How busy the fleet is counts in decode steps, the unit in which a worker hands its compute between prefill and
  // decode: the same 0.3 s is under a third of a 1 s step, and the copy goes to the least-loaded worker.
  for (auto& w : s.workers) w.decode_step_s = 1.0;
  EXPECT_EQ(p->pick(s.context())->worker, 1u);
}

// Two workers at 1000 prefill tokens/s and 1e-6 s per context token per decode step; worker 0 holds 8 of the
// prompt's 10 blocks, worker 1 none.
Scene holder_and_other() {
  Scene s(2);
  for (auto& w : s.workers) {
    w.prefill_tokens_per_s = 1000;
    w.decode_step_per_token_s = 1e-6;
  }
  s.match.blocks = {8, 0};
  return s;
}

// What a request adds to the inter-token latency of the requests already in flight on a worker is priced by the
// means it moves: with 1e-6 s per context token per decode step, each of them decodes about half of the request's
// 256 steps with its 1128 tokens (1000 of prompt, half its output) in the batch. The fleet's means here: TTFT 1 s,
// inter-token latency 30 ms, end-to-end latency 10 s.
TEST(KvCost, LeavesAPrefixHolderWhenItWouldSlowTheRequestsRunningThereMore) {
  Scene s = holder_and_other();
  s.ctx.fleet_means = {.ttft_s = 1.0, .itl_s = 0.03, .e2e_s = 10.0};
  // 10 requests in flight on the holder (the router's own count; the worker has not reported them yet): what the
  // request adds to their decodes costs less than recomputing 800 tokens elsewhere.
  s.workers[0].in_flight = 10;
  EXPECT_EQ(fresh_kv_cost_pick(s.context())->worker, 0u);
  // 100 in flight: more than recomputing the 800 tokens elsewhere costs; the prefix is copied.
  s.workers[0].in_flight = 100;
  EXPECT_EQ(fresh_kv_cost_pick(s.context())->worker, 1u);
  // The same when the worker reports them running and the router has none of its own in flight there.
  s.workers[0].in_flight = 0;
  s.workers[0].running = 100;
  EXPECT_EQ(fresh_kv_cost_pick(s.context())->worker, 1u);
}

// Each second is weighed by the mean it moves, as a share of that mean. Where the mean inter-token latency is long
// against the mean TTFT (a second of TTFT is a larger share), the 100 requests running on the holder no longer
// outweigh recomputing the prefix: the request stays. Where it is short (1 ms against a 1 s TTFT), 10 running
// there are enough to leave: the request's own steps at the holder's batch and what it adds to theirs are a larger
// share of the mean ITL.
TEST(KvCost, EachMeanWeighsTheSecondsThatMoveItByItsOwnScale) {
  Scene s = holder_and_other();
  s.workers[0].in_flight = 100;
  s.ctx.fleet_means = {.ttft_s = 1.0, .itl_s = 0.03, .e2e_s = 10.0};
  EXPECT_EQ(fresh_kv_cost_pick(s.context())->worker, 1u);  // as the test above
  s.ctx.fleet_means = {.ttft_s = 1.0, .itl_s = 1.0, .e2e_s = 1000.0};
  EXPECT_EQ(fresh_kv_cost_pick(s.context())->worker, 0u);
  s.workers[0].in_flight = 10;
  s.ctx.fleet_means = {.ttft_s = 1.0, .itl_s = 0.03, .e2e_s = 10.0};
  EXPECT_EQ(fresh_kv_cost_pick(s.context())->worker, 0u);
  s.ctx.fleet_means = {.ttft_s = 1.0, .itl_s = 0.001, .e2e_s = 10.0};
  EXPECT_EQ(fresh_kv_cost_pick(s.context())->worker, 1u);
}

// Before the fleet's means are known (a mean needs kKnownMeanValues completed requests: with long outputs, tens of
// seconds), each is the model's own estimate of it (over the requests priced so far, the mean of what each would
// have on the candidates), and the cost is the same. Two workers without the prefix: worker 0 has 0.2 s of prefill
// queued and 10 requests decoding, worker 1 none queued and 16 decoding; the request has a 3,000-token prompt and
// asks for 2,000 tokens. Its 0.2 s wait is a larger share of a typical TTFT than six more requests in the batch are
// of a typical inter-token latency (about 1 ms more per step: 24,000 context tokens at 4.4e-8 s each, Qwen3-8B on
// an H100): it goes to worker 1. (The earlier cold cost, the others' end-to-end time one for one against the
// request's TTFT, sent it to worker 0, and a burst piled up there.)
TEST(KvCost, BeforeTheMeansAreKnownEachIsTheModelsOwnEstimate) {
  Scene s(2);
  for (auto& w : s.workers) {
    w.prefill_tokens_per_s = 15000;
    w.decode_step_per_token_s = 4.4e-8;
  }
  s.workers[0].pending_prefill_tokens = 3000;
  s.workers[0].in_flight = s.workers[0].running = 10;
  s.workers[1].in_flight = s.workers[1].running = 16;
  for (auto& w : s.workers) {
    w.active_decode_tokens = w.running * 4000;
    w.decode_step_s = 0.01 + 4.4e-8 * static_cast<double>(w.active_decode_tokens);
  }
  s.context();
  s.ctx.max_tokens = 2000;
  s.ctx.prompt_tokens = 3000;
  EXPECT_EQ(fresh_kv_cost_pick(s.ctx)->worker, 1u);
  // The same once the means are known and alike: TTFT 0.1 s, ITL 12 ms, end-to-end 25 s.
  s.ctx.fleet_means = {.ttft_s = 0.1, .itl_s = 0.012, .e2e_s = 25.0};
  EXPECT_EQ(fresh_kv_cost_pick(s.ctx)->worker, 1u);
  // Where a typical request's TTFT is long against its inter-token latency (5 s against 1 ms), the six more in the
  // batch weigh more than the 0.2 s wait: worker 0.
  s.ctx.fleet_means = {.ttft_s = 5.0, .itl_s = 0.001, .e2e_s = 25.0};
  EXPECT_EQ(fresh_kv_cost_pick(s.ctx)->worker, 0u);
}

// Rent or buy (policy/kv_cost.cc): a request that stays on its prefix's holder where the other worker would serve it
// for less with a copy pays the difference as rent into the prefix's account; once the account reaches what the
// copy costs on top, the copy is bought, off any request's path: the request still goes to the holder, and its pick
// names the other worker to warm (Pick::warm). The holder has 16 requests in flight: each request's cheapest choice
// is to stay, and the third buys (the scene does not change, so it goes on renting and buying in turn).
TEST(KvCost, APrefixsRequestsBuyACopyOnceTheRentTheyPaidReachesItsPrice) {
  auto p = make("kv_cost");
  Scene s = holder_and_other();
  s.workers[0].in_flight = 16;
  s.workers[1].capacity_blocks = 1000;  // four fifths of the other's cache hold blocks hit again: a copied block
  s.workers[1].reused_blocks = 800;     // sets off 4 recomputes there
  s.ctx.fleet_means = {.ttft_s = 1.0, .itl_s = 0.03, .e2e_s = 10.0};
  // Each request stays on the holder, the cheapest worker, and pays rent until the copy is bought.
  auto stays = [&](const std::optional<Pick>& pick) { return pick && pick->worker == 0 && !pick->warm; };
  EXPECT_TRUE(stays(fresh_kv_cost_pick(s.context())));
  EXPECT_TRUE(stays(p->pick(s.context())));
  EXPECT_TRUE(stays(p->pick(s.context())));
  // The copy is made off the request's path: it still goes to the holder, and the router warms the other worker.
  const auto buy = p->pick(s.context());
  EXPECT_EQ(buy->worker, 0u);
  EXPECT_EQ(buy->reason, Reason::kPrefixHit);
  EXPECT_EQ(buy->predicted_cached_tokens, s.context().matched_tokens(0));
  EXPECT_EQ(buy->warm, std::optional<std::size_t>(1));
  EXPECT_TRUE(stays(p->pick(s.context())));  // the account starts again
  // Another prefix (its deepest held block differs) has an account of its own: its rent does not bring the first
  // one's copy nearer.
  s.chain.hashes[7] = 1;
  EXPECT_TRUE(stays(p->pick(s.context())));
  s.chain.hashes[7] = 0;
  EXPECT_TRUE(stays(p->pick(s.context())));
  EXPECT_EQ(p->pick(s.context())->warm, std::optional<std::size_t>(1));
  // No rent accrues while the other worker has prefill queued: a copy there would delay it.
  s.workers[1].pending_prefill_tokens = 100;
  for (int k = 0; k < 10; ++k) EXPECT_TRUE(stays(p->pick(s.context())));
}

// The request's own inter-token latency counts the requests in flight on a worker at least as its own context each:
// the router counts a request's context in the decode batch only from its first token, and a burst sent to a
// worker since would otherwise leave it looking free. Two holders with 4 requests decoding; one has 1,000 context
// tokens fewer decoding but 6 more requests in flight still in prefill. (beta 0: what the request adds to their
// steps is left out.)
TEST(KvCost, ABurstStillInPrefillCountsInTheBatchItsNextRequestJoins) {
  PolicyOptions o;
  o.beta = 0;
  auto p = std::move(*make_policy("kv_cost", o));
  Scene s = holder_and_other();
  s.match.blocks = {8, 8};
  s.ctx.fleet_means = {.ttft_s = 1.0, .itl_s = 0.001, .e2e_s = 10.0};
  for (auto& w : s.workers) {
    w.active_decode_tokens = 5000;
    w.in_flight = 4;
    w.running = 4;
    w.decode_step_s = 0.02 + 1e-6 * 5000;
  }
  s.workers[0].active_decode_tokens = 4000;
  s.workers[0].decode_step_s = 0.02 + 1e-6 * 4000;
  EXPECT_EQ(p->pick(s.context())->worker, 0u);  // nothing in prefill: the smaller batch
  s.workers[0].in_flight = 10;
  EXPECT_EQ(p->pick(s.context())->worker, 1u);
}

// The duplicate term prices what a copy of a prefix does to the cache it goes into as the eviction cascade it sets
// off: each copied block displaces one, which with probability r (the share of the cache holding blocks hit again)
// is computed anew and displaces another, r / (1 - r) recomputes in all. A copy onto a worker whose cache holds
// nothing reused costs its prefill, and nothing more while some worker's prefill queue is empty.
TEST(KvCost, ACopyOfAPrefixCostsTheEvictionCascadeItSetsOffInTheCacheItGoesInto) {
  Scene s = holder_and_other();
  for (auto& w : s.workers) w.capacity_blocks = 1000;
  s.workers[0].in_flight = 10;
  s.ctx.fleet_means = {.ttft_s = 1.0, .itl_s = 0.03, .e2e_s = 10.0};  // as in the tests above
  // Worker 1's cache is full of blocks hit again: a copy would displace them and the request stays.
  s.workers[1].reused_blocks = 1000;
  EXPECT_EQ(fresh_kv_cost_pick(s.context())->worker, 0u);
  // Four fifths of it: each copied block sets off 4 recomputes, more than what the request adds to the decodes of
  // the 10 in flight on the holder.
  s.workers[1].reused_blocks = 800;
  EXPECT_EQ(fresh_kv_cost_pick(s.context())->worker, 0u);
  // A fifth of it: a quarter of a recompute per copied block, and the copy goes; and nothing hit again: the copy
  // costs its prefill alone.
  s.workers[1].reused_blocks = 200;
  EXPECT_EQ(fresh_kv_cost_pick(s.context())->worker, 1u);
  s.workers[1].reused_blocks = 0;
  EXPECT_EQ(fresh_kv_cost_pick(s.context())->worker, 1u);
  // The same worker while every worker has a prefill queue: the copy takes GPU time from other requests.
  s.workers[0].pending_prefill_tokens = 100;
  s.workers[1].pending_prefill_tokens = 100;
  EXPECT_EQ(fresh_kv_cost_pick(s.context())->worker, 0u);
}

// A copy of a prefix is computed in the steps that decode the requests running where it goes, so it delays each of
// them by its prefill time: priced as their time. Two workers at 1000 prefill tokens/s, decode steps of 20 ms and no
// cost per context token (the inter-token term is zero); the holder has 3 s of prefill queued, the other holds
// nothing reused (a copy does not displace reuse) and has an empty queue.
TEST(KvCost, ACopyIsPricedByTheTimeItTakesFromTheRequestsDecodingWhereItGoes) {
  Scene s(2);
  for (auto& w : s.workers) {
    w.prefill_tokens_per_s = 1000;
    w.decode_step_s = 0.02;
    w.capacity_blocks = 1000;
  }
  s.match.blocks = {8, 0};
  s.workers[0].pending_prefill_tokens = 3000;
  // Two requests decode on the other worker: the 0.8 s copy costs them 1.6 s, less than the 3 s wait.
  s.workers[1].in_flight = 2;
  EXPECT_EQ(fresh_kv_cost_pick(s.context())->worker, 1u);
  // Twenty: 16 s of their time; the request waits for its prefix's holder.
  s.workers[1].in_flight = 20;
  EXPECT_EQ(fresh_kv_cost_pick(s.context())->worker, 0u);
  // The same twenty, reported by the worker rather than counted by this router.
  s.workers[1].in_flight = 0;
  s.workers[1].running = 20;
  EXPECT_EQ(fresh_kv_cost_pick(s.context())->worker, 0u);
  // Behind a queue longer than their decodes (256 steps of 2 ms), they will have finished when the copy runs. (A
  // third worker, idle but slow, keeps the fleet from counting as busy, which would price the copy higher still.)
  s.workers.push_back(s.workers[0]);
  s.workers[2].id = 2;
  s.workers[2].pending_prefill_tokens = 0;
  s.workers[2].prefill_tokens_per_s = 10;
  s.match.blocks.push_back(0);
  s.match.cpu_blocks.push_back(0);
  EXPECT_EQ(fresh_kv_cost_pick(s.context())->worker, 0u);
  s.workers[1].pending_prefill_tokens = 600;
  s.workers[1].decode_step_s = 0.002;
  EXPECT_EQ(fresh_kv_cost_pick(s.context())->worker, 1u);
}

// A request opening a session binds its later turns: it goes to a worker with the fewest live sessions bound even
// where another worker would serve this turn a little sooner; among those to the one whose last session opened
// longest ago, and then to the cheapest. While a worker holding the longest prefix of the prompt has no more
// sessions than the fleet's mean, the holders take it (the prefix is not computed again).
TEST(KvCost, OpensASessionOnAWorkerWithTheFewestSessions) {
  auto p = make("kv_cost");
  Scene s(4);
  for (auto& w : s.workers) w.prefill_tokens_per_s = 1000;
  s.match.blocks = {5, 0, 2, 0};  // worker 0 holds half the prompt, worker 2 a fifth
  s.workers[0].in_flight = 3;
  s.workers[1].in_flight = 1;
  s.workers[2].in_flight = 1;
  s.workers[0].sessions = 2;  // above the mean (0.75): the holder does not take another
  s.workers[3].sessions = 1;  // idle, but a session waits there for its next turn
  EXPECT_EQ(binds(p->pick(s.context())), 0u);  // one more request: the cached prefix wins
  s.ctx.opens_session = true;
  auto pick = p->pick(s.ctx);
  EXPECT_EQ(binds(pick), 2u);  // no session bound, the least busy, and of those the one holding more of the prompt
  // Its first turn goes to the holder of the longest prefix, which serves it sooner; the prompt is warmed on the
  // session's worker (KvCost.ASessionsFirstTurnGoesToItsPrefixsHolderAndTheSessionWhereTheBalanceWantsIt).
  EXPECT_EQ(pick->worker, 0u);
  EXPECT_EQ(pick->predicted_cached_tokens, 500u);
  // With the holder at the mean (one session everywhere), it takes the session though it is the busiest.
  for (auto& w : s.workers) w.sessions = 1;
  EXPECT_EQ(binds(p->pick(s.ctx)), 0u);
  // Its next turn is bound to the worker it opened on (session affinity), not opened again.
  s.ctx.opens_session = false;
  s.ctx.preferred = 2;
  EXPECT_EQ(p->pick(s.ctx)->worker, 2u);
}

// Between workers with as many sessions bound, an opening goes to the one whose last session opened longest ago,
// however many requests it has in flight (a session between two turns has none, one that has ended neither); a
// worker no session has opened on yet comes first. A burst of openings so goes round the fleet in turn.
TEST(KvCost, AnOpeningGoesWhereTheLastSessionOpenedLongestAgo) {
  auto p = make("kv_cost");
  Scene s(3);
  for (auto& w : s.workers) {
    w.prefill_tokens_per_s = 1000;
    w.sessions = 2;
  }
  s.workers[0].session_opened_ago_s = 5.0;
  s.workers[1].session_opened_ago_s = 30.0;
  s.workers[1].in_flight = 6;
  s.workers[2].session_opened_ago_s = 1.0;
  s.ctx.opens_session = true;
  for (std::uint64_t seq = 0; seq < 3; ++seq) {  // wherever the scan starts
    s.ctx.sequence = seq;
    EXPECT_EQ(binds(p->pick(s.context())), 1u);
  }
  s.workers[0].session_opened_ago_s = std::numeric_limits<double>::infinity();  // none opened there yet
  EXPECT_EQ(binds(p->pick(s.context())), 0u);
  s.workers[0].sessions = 3;  // the fewest sessions still come first
  EXPECT_EQ(binds(p->pick(s.context())), 1u);
}

// A session does not open by copying its prefix into a cache with no room for it beside the blocks there that are
// hit again: the copy would evict reused blocks for the balance's sake. Capacity 1,000 blocks everywhere; worker 0
// holds 8 of the prompt's 10 blocks and has more sessions than the mean.
TEST(KvCost, ASessionDoesNotOpenByCopyingItsPrefixIntoACacheFullOfReusedBlocks) {
  auto p = make("kv_cost");
  Scene s(3);
  for (auto& w : s.workers) {
    w.prefill_tokens_per_s = 1000;
    w.capacity_blocks = 1000;
  }
  s.match.blocks = {8, 0, 0};
  s.workers[0].sessions = 5;
  s.workers[1].reused_blocks = 1000;
  s.workers[2].reused_blocks = 995;  // room for 5 blocks, not the 8 it would copy
  s.ctx.opens_session = true;
  EXPECT_EQ(binds(p->pick(s.context())), 0u);
  // Room on worker 2: the fewest sessions decide again.
  s.workers[2].reused_blocks = 992;
  EXPECT_EQ(binds(p->pick(s.context())), 2u);
  // A cache of unknown capacity is not held back.
  s.workers[1].capacity_blocks = 0;
  s.workers[1].in_flight = 0;
  s.workers[2].in_flight = 1;
  EXPECT_EQ(binds(p->pick(s.context())), 1u);
}

// The prefix hold pays only while the prefix's prefill outlasts the worker's fixed part of TTFT, which a held request
// starts only once the prefix lands: on a 30,000 tokens/s worker with a 50 ms front end, a 12K-token prefix (0.34 s)
// is worth waiting for, a 1,120-token one (25 ms) is not. (The leader computing all of it has not started yet.)
TEST(PrefixHold, PaysOnlyWhileThePrefixsPrefillOutlastsTheFixedPartOfTtft) {
  WorkerView w;
  w.prefill_tokens_per_s = 30000;
  w.base_ttft_s = 0.05;
  EXPECT_TRUE(prefix_hold_pays(w, 12288, 12288, false));
  EXPECT_FALSE(prefix_hold_pays(w, 1120, 1120, false));
  EXPECT_NEAR(prefill_seconds(1120, 0, 30000), 0.025, 0.001);
  w.base_ttft_s = 0.02;  // a leaner front end: the same prefix is worth the wait
  EXPECT_TRUE(prefix_hold_pays(w, 1120, 1120, false));
  w.base_ttft_s = 0;  // not learned yet: any prefix
  EXPECT_TRUE(prefix_hold_pays(w, 16, 16, false));
}

// Once the leader's prefill has started on a part of the prefix that fits in one chunk, the step computing it ends
// before the request could be admitted: sent at once, the request reads the whole prefix, so no hold. A leader
// computing more than a chunk of it shares its last chunk's step with the request sent at once, which would
// compute that part again: the hold still pays. Until the leader starts, both would be admitted together.
TEST(PrefixHold, NotOnceTheLeaderComputesItsLastChunkOfThePrefix) {
  WorkerView w;
  w.prefill_tokens_per_s = 30000;
  w.base_ttft_s = 0.05;
  EXPECT_FALSE(prefix_hold_pays(w, 6144, 6144, true));
  EXPECT_TRUE(prefix_hold_pays(w, 6144, 6144, false));
  EXPECT_FALSE(prefix_hold_pays(w, 20480, kChunkTokens, true));  // the rest of the prefix was cached there
  EXPECT_TRUE(prefix_hold_pays(w, 20480, kChunkTokens + 16, true));
  EXPECT_TRUE(prefix_hold_pays(w, 20480, 20480, true));
}

// Of a later turn, what the session keeps on its worker alone: the prompt and expected output less the longest
// match on any other worker.
TEST(OwnContextTokens, ThePromptAndOutputLessTheLongestMatchElsewhere) {
  Scene s(3);
  s.match.blocks = {10, 6, 2};
  s.context();
  s.ctx.max_tokens = 100;
  EXPECT_EQ(own_context_tokens(s.ctx), 0.0);  // not a later turn
  s.ctx.preferred = 0;
  EXPECT_EQ(own_context_tokens(s.ctx), 1000.0 + 100 - 600);
  s.ctx.preferred = 1;
  EXPECT_EQ(own_context_tokens(s.ctx), 100.0);  // worker 0 holds the whole prompt
}

// A session opens on the prefix's holder with more sessions than the mean while the excess sessions' own contexts
// (RoutingContext::session_context_tokens each, less the prefix) take less KV than copying the prefix, and the holder
// has room for this session's beside its reused blocks; otherwise on the worker with the fewest sessions, as before.
TEST(KvCost, ASessionOpensOnTheHolderWhileItsExcessSessionsTakeLessKvThanACopy) {
  auto p = make("kv_cost");
  Scene s(3);
  for (auto& w : s.workers) w.capacity_blocks = 1000;
  s.match.blocks = {8, 0, 0};  // an 800-token document on worker 0
  s.workers[0].sessions = 5;
  s.workers[1].sessions = 1;   // mean 2: worker 0 has 3 more
  s.context();
  s.ctx.opens_session = true;
  EXPECT_EQ(binds(p->pick(s.ctx)), 2u);  // no later turn seen yet
  // Later turns' own contexts count the document (no other worker holds it): what a session keeps alone is its
  // context beyond the document.
  s.ctx.session_context_tokens = 1050;  // 3 x (1,050 - 800) < 800
  EXPECT_EQ(binds(p->pick(s.ctx)), 0u);
  s.ctx.session_context_tokens = 1100;  // 3 x 300 > 800
  EXPECT_EQ(binds(p->pick(s.ctx)), 2u);
  s.ctx.session_context_tokens = 300;  // nothing beyond the document
  EXPECT_EQ(binds(p->pick(s.ctx)), 0u);
  s.ctx.session_context_tokens = 1050;
  s.workers[0].reused_blocks = 998;  // 200 tokens of room, not the 250 the session is taken to keep
  s.context();
  EXPECT_EQ(binds(p->pick(s.ctx)), 2u);
}

// A session does not open on the least bound holder when its first turn there would wait longer than a typical
// request takes in all (the fleet's mean end-to-end latency) and that holder has more than the mean requests in
// flight: it opens on another holder. In a fleet whose requests take longer than that wait, or with the holder no
// busier than the mean, the fewest sessions decide.
TEST(KvCost, ASessionDoesNotOpenWhereItsFirstTurnWouldWaitLongerThanATypicalRequest) {
  auto p = make("kv_cost");
  Scene s(3);
  for (auto& w : s.workers) w.prefill_tokens_per_s = 20000;
  s.match.blocks = {10, 10, 0};  // workers 0 and 1 hold the whole 40K-token document
  s.workers[0].sessions = 1;
  s.workers[1].sessions = 2;
  s.workers[2].sessions = 2;
  s.workers[0].in_flight = 20;
  s.workers[0].pending_prefill_tokens = 200000;  // 10 s and more queued there
  s.workers[1].in_flight = 2;
  s.context();
  s.ctx.tokens_per_block = 4000;
  s.ctx.prompt_tokens = 40500;
  s.ctx.opens_session = true;
  s.ctx.fleet_means = {1.0, 0.02, 5.0};
  EXPECT_EQ(binds(p->pick(s.ctx)), 1u);
  s.ctx.fleet_means = {1.0, 0.02, 100.0};  // requests take 100 s: 10 s of waiting is not the tail
  EXPECT_EQ(binds(p->pick(s.ctx)), 0u);
  s.ctx.fleet_means = {1.0, 0.02, 5.0};
  s.workers[0].in_flight = 2;  // as busy as the mean: its queue alone does not move the opening
  s.workers[1].in_flight = 3;
  s.workers[2].in_flight = 4;
  s.ctx.workers = s.workers;
  EXPECT_EQ(binds(p->pick(s.ctx)), 0u);
}

// A session opening the balance sends to a worker without its prefix: its first turn goes to the prefix's holder,
// which serves it sooner, and the session is bound to the balance's worker, which the router warms with the prompt
// (Pick::session_worker, Pick::warm), so the later turns find the prefix there and the first does not wait for the
// copy. Not when that worker has prefill queued (the warm-up would delay it: the turn makes the copy itself, as
// before), nor when the holder's queue is longer than a typical request takes and it has more than the mean in flight.
TEST(KvCost, ASessionsFirstTurnGoesToItsPrefixsHolderAndTheSessionWhereTheBalanceWantsIt) {
  Scene s(2);
  for (auto& w : s.workers) w.prefill_tokens_per_s = 1000;
  s.match.blocks = {8, 0};  // an 800-token prefix on worker 0
  s.workers[0].sessions = 2;
  s.context();
  s.ctx.opens_session = true;
  s.ctx.fleet_means = {.ttft_s = 1.0, .itl_s = 0.03, .e2e_s = 10.0};
  auto pick = fresh_kv_cost_pick(s.ctx);
  EXPECT_EQ(pick->worker, 0u);
  EXPECT_EQ(pick->predicted_cached_tokens, 800u);
  EXPECT_EQ(pick->session_worker, std::optional<std::size_t>(1));
  EXPECT_EQ(pick->warm, std::optional<std::size_t>(1));
  // Worker 1 has prefill queued: the opening goes there and copies the prefix on its own path.
  s.workers[1].pending_prefill_tokens = 100;
  s.context();
  pick = fresh_kv_cost_pick(s.ctx);
  EXPECT_EQ(pick->worker, 1u);
  EXPECT_FALSE(pick->session_worker);
  EXPECT_FALSE(pick->warm);
  // The holder has 50 s of prefill queued and more requests in flight than the mean: likewise.
  s.workers[1].pending_prefill_tokens = 0;
  s.workers[0].pending_prefill_tokens = 50000;
  s.workers[0].in_flight = 10;
  s.context();
  pick = fresh_kv_cost_pick(s.ctx);
  EXPECT_EQ(pick->worker, 1u);
  EXPECT_FALSE(pick->session_worker);
  // A request that opens no session names no session worker.
  s.workers[0].pending_prefill_tokens = 0;
  s.workers[0].in_flight = 0;
  s.context();
  s.ctx.opens_session = false;
  EXPECT_FALSE(fresh_kv_cost_pick(s.ctx)->session_worker);
}

// A session opening the balance sends to a worker whose queue would make its first turn wait longer, beyond the
// cheapest candidate's TTFT, than the fleet's mean TTFT: the first turn goes to the cheapest, and the session stays
// bound to the balance's worker, with no warm-up (its second turn computes there what the first would have). Within
// the mean, the balance's worker serves the first turn too.
TEST(KvCost, ASessionsFirstTurnGoesWhereItIsServedSoonestWhenTheBalanceWouldPutItInTheTail) {
  Scene s(3);
  for (auto& w : s.workers) w.prefill_tokens_per_s = 20000;
  s.workers[0].sessions = 0;  // the fewest sessions bound: the balance's worker
  s.workers[1].sessions = 2;
  s.workers[2].sessions = 2;
  s.workers[0].pending_prefill_tokens = 40000;  // 2 s of prefill queued there; none elsewhere
  s.workers[0].pending_prefill_s = 2.0;
  s.context();
  s.ctx.opens_session = true;
  s.ctx.fleet_means = {.ttft_s = 0.5, .itl_s = 0.03, .e2e_s = 10.0};
  auto pick = fresh_kv_cost_pick(s.ctx);
  EXPECT_NE(pick->worker, 0u);
  EXPECT_EQ(pick->session_worker, std::optional<std::size_t>(0));
  EXPECT_FALSE(pick->warm);
  EXPECT_EQ(binds(pick), 0u);
  // Requests take 3 s to a first token on average: a 2 s wait is not the tail, the balance's worker serves it.
  s.ctx.fleet_means.ttft_s = 3.0;
  pick = fresh_kv_cost_pick(s.ctx);
  EXPECT_EQ(pick->worker, 0u);
  EXPECT_FALSE(pick->session_worker);
}

// Router replicas that route at once on an idle fleet (each one's first request, or a burst spread over them)
// see identical workers. Each counting its own requests from 0, all would start the tie rotation at one worker;
// with the sequence interleaved by rank they pick four different ones, as one router routing the four in turn.
TEST(KvCost, ReplicasRoutingAtOnceOnIdleWorkersPickDifferentOnes) {
  auto p = make("kv_cost");
  Scene s(4);
  std::set<std::size_t> picked, herded;
  for (std::size_t rank = 0; rank < 4; ++rank) {
    s.ctx.sequence = 0;
    herded.insert(p->pick(s.context())->worker);
    s.ctx.sequence = replica_sequence(/*own=*/0, rank, /*replicas=*/4);
    picked.insert(p->pick(s.ctx)->worker);
  }
  EXPECT_EQ(herded.size(), 1u);
  EXPECT_EQ(picked.size(), 4u);
  EXPECT_EQ(replica_sequence(7, 0, 1), 7u);  // alone: its own count
  EXPECT_EQ(replica_sequence(7, 2, 4), 30u);
  EXPECT_EQ(replica_sequence(7, 9, 4), 31u);  // a rank past the members last counted stays in its slot
}

// The queue is credited the time the worker has spent on it since its last first token, up to the oldest pending
// prefill's estimate, and counts the pending requests' own estimates when they are larger (their attention to
// cached context). While requests decode there, each chunk's step also decodes the batch, so the time since counts
// at a chunk's share of its step: 8,192 tokens at 1,000 tokens/s take 8.192 s, and a 2.048 s decode step makes
// the share 0.8.
TEST(KvCost, TheQueueIsCreditedTheWorkDoneOnIt) {
  auto p = make("kv_cost");
  Scene s(1);
  WorkerView& w = s.workers[0];
  w.prefill_tokens_per_s = 1000;
  w.pending_prefill_tokens = 3000;  // 3 s at the reference rate
  w.pending_prefill_s = 3.0;
  w.oldest_prefill_s = 3.0;
  const double fresh = p->estimate(s.context(), 0);
  w.prefill_elapsed_s = 1.0;
  EXPECT_NEAR(fresh - p->estimate(s.context(), 0), 1.0, 1e-9);
  w.prefill_elapsed_s = 10.0;  // overdue: the credit stops at the oldest's estimate
  EXPECT_NEAR(fresh - p->estimate(s.context(), 0), 3.0, 1e-9);
  w.pending_prefill_s = 9.0;  // the pending requests attend to long cached contexts
  EXPECT_NEAR(p->estimate(s.context(), 0) - fresh, 9.0 - 3.0 - 3.0, 1e-9);
  // A short prefill at the head is credited alike: 0.5 s done of it.
  w.pending_prefill_s = 3.0;
  w.oldest_prefill_s = 0.5;
  w.prefill_elapsed_s = 0.5;
  EXPECT_NEAR(fresh - p->estimate(s.context(), 0), 0.5, 1e-9);
  // Decoding there: 1 s since the last first token is 0.8 s of prefill, and the chunk steps are counted on what
  // is left of the queue (one 8,192-token step covers it all, so the steps do not change).
  w.oldest_prefill_s = 3.0;
  w.prefill_elapsed_s = 1.0;
  w.running = 4;
  w.decode_step_s = 2.048;
  const double decoding = [&] {
    w.prefill_elapsed_s = 0;
    const double e = p->estimate(s.context(), 0);
    w.prefill_elapsed_s = 1.0;
    return e;
  }();
  EXPECT_NEAR(decoding - p->estimate(s.context(), 0), 0.8, 1e-9);
}

// Four 30K-token prompts queued on a worker take as long as their own prefills, each attending to its own tokens; the
// queue is not priced as one 120K-token prompt, whose attention costs more than twice as much.
TEST(KvCost, AQueueOfSeveralPromptsCostsTheirOwnPrefillsNotOnePromptAsLong) {
  auto p = make("kv_cost");
  Scene s(1);
  WorkerView& w = s.workers[0];
  w.prefill_tokens_per_s = 20000;
  const double idle = p->estimate(s.context(), 0);
  w.pending_prefill_tokens = 120000;
  w.pending_prefill_s = 4 * prefill_seconds(30000, 0, 20000);
  w.oldest_prefill_s = prefill_seconds(30000, 0, 20000);
  const double queued = p->estimate(s.context(), 0) - idle;
  EXPECT_NEAR(queued, w.pending_prefill_s, 1e-9);
  EXPECT_GT(prefill_seconds(120000, 0, 20000), 2 * queued);
}

// What kv_cost reports (Pick::expected_ttft_s) is the TTFT it expects, not the one it compares: the worker's fixed
// part included, and admission behind a full pool as the engine's waiting line; the routing estimate leaves the
// fixed part out (every worker has it) and prices the pool's shortfall instead. Both credit the queue's progress.
TEST(KvCost, ExpectedTtftAddsTheFixedPartAndTheEnginesWaitingLine) {
  auto p = make("kv_cost");
  Scene s(1);
  WorkerView& w = s.workers[0];
  w.prefill_tokens_per_s = 1000;
  w.base_ttft_s = 0.05;
  const double prefill = prefill_seconds(1000, 0, 1000);
  EXPECT_NEAR(p->estimate(s.context(), 0), prefill, 1e-9);
  EXPECT_NEAR(p->expected_ttft(s.context(), 0), 0.05 + prefill, 1e-9);
  w.pending_prefill_tokens = 500;  // 0.5 s queued, 0.2 s of it done: 0.3 s are left
  w.pending_prefill_s = 0.5;
  w.oldest_prefill_s = 0.5;
  w.prefill_elapsed_s = 0.2;
  EXPECT_NEAR(p->estimate(s.context(), 0), 0.3 + prefill, 1e-9);
  EXPECT_NEAR(p->expected_ttft(s.context(), 0), 0.05 + 0.3 + prefill, 1e-9);
  const auto pick = p->pick(s.context());
  ASSERT_TRUE(pick);
  EXPECT_NEAR(pick->expected_ttft_s, 0.05 + 0.3 + prefill, 1e-9);
  // A pool without room for the request (100K tokens, 500 free: it needs 1,000 prompt tokens and 100 of output):
  // with 3 requests waiting and 20 running, each running one 100 tokens x 0.02 s from its end, the line moves
  // every 0.1 s and this request is 4th in it.
  w.pending_prefill_tokens = 0;
  w.pending_prefill_s = w.oldest_prefill_s = w.prefill_elapsed_s = 0;
  w.capacity_blocks = 1000;
  w.kv_usage = 0.995;
  w.running = 20;
  w.waiting = 3;
  w.decode_step_s = 0.02;
  s.ctx.max_tokens = 100;
  const double step = 0.02;  // the chunked-prefill step a decoding worker adds
  EXPECT_NEAR(p->expected_ttft(s.context(), 0), 0.05 + step + prefill + 4 * 100 * 0.02 / 20, 1e-9);
  w.waiting = 0;  // nobody waits: admitted at once
  EXPECT_NEAR(p->expected_ttft(s.context(), 0), 0.05 + step + prefill, 1e-9);
  w.waiting = 3;
  w.kv_usage = 0.95;  // 5,000 tokens free: room for it, so the line is not this request's
  EXPECT_NEAR(p->expected_ttft(s.context(), 0), 0.05 + step + prefill, 1e-9);
  // A policy without an expected TTFT reports its estimate plus the fixed part.
  Pick plain;
  plain.estimate_s = 0.2;
  EXPECT_NEAR(corrected_ttft_estimate(plain, w), 0.25, 1e-12);
}

// The TTFT price is convex on the scale of the fleet's mean end-to-end latency: a wait as long as a typical request
// takes in all counts its seconds three times. In a fleet of long requests (a 100 s mean) a prompt waits for the
// worker holding a third of it rather than copy that third elsewhere; where requests take 2 s in all, that wait
// is the tail, and it goes to the idle worker.
TEST(KvCost, AWaitCostsMoreTheShorterTheFleetsRequests) {
  auto p = make("kv_cost");
  Scene s(2);
  for (auto& w : s.workers) {
    w.prefill_tokens_per_s = 10000;
    w.capacity_blocks = 10000;  // caches four fifths full of blocks hit again: a copied block sets off 4 recomputes
    w.reused_blocks = 8000;
  }
  s.chain.hashes.assign(300, 0);
  s.match.blocks = {100, 0};                    // worker 0 holds a third of the prompt
  s.workers[0].pending_prefill_tokens = 37500;  // and is busy: a TTFT of 6.9 s there, 3.2 s on worker 1
  auto ctx = s.context();
  ctx.prompt_tokens = 30000;
  ctx.fleet_means = {1.0, 0.02, 100.0};
  EXPECT_EQ(p->pick(ctx)->worker, 0u);
  ctx.fleet_means = {1.0, 0.02, 2.0};
  EXPECT_EQ(p->pick(ctx)->worker, 1u);
}

// Admission waits for the pool's room, as the engine admits: a request starts once the free blocks hold it after
// the prefill queued ahead. What is missing is freed as the requests in flight end (each its own tokens, their
// ends spread over one turnover of out x step); a pool with room admits at once however full it looks.
TEST(KvCost, AdmissionWaitsForThePoolsRoomNotForAUsageThreshold) {
  auto p = make("kv_cost");
  Scene s(2);
  for (auto& w : s.workers) {
    w.prefill_tokens_per_s = 1000;
    w.capacity_blocks = 1000;  // 100K tokens
    w.running = 20;
    w.decode_step_s = 0.02;
  }
  s.ctx.max_tokens = 100;  // the request needs 1,000 prompt tokens and 100 of output
  const double base = p->estimate(s.context(), 0);
  s.workers[0].kv_usage = 0.98;  // 2,000 tokens free: room, at a usage the old 0.9 threshold called full
  EXPECT_NEAR(p->estimate(s.context(), 0), base, 1e-12);
  s.workers[0].kv_usage = 0.995;             // 500 free, 600 missing,
  s.workers[0].inflight_kv_tokens = 6000;    // a tenth of what the requests in flight free as they end:
  EXPECT_NEAR(p->estimate(s.context(), 0), base + 0.1 * 100 * 0.02, 1e-9);  // a tenth of a 2 s turnover
  s.workers[0].pending_prefill_tokens = 2400;  // prefill queued ahead takes the room first: 3,000 missing, half
  s.workers[1].pending_prefill_tokens = 2400;  // of a turnover (worker 1 has the same queue and room for both)
  EXPECT_NEAR(p->estimate(s.context(), 0) - p->estimate(s.context(), 1), 0.5 * 100 * 0.02, 1e-9);
  s.workers[0].pending_prefill_tokens = s.workers[1].pending_prefill_tokens = 0;
  s.workers[0].inflight_kv_tokens = 0;  // nothing of this router's in flight: a whole turnover
  EXPECT_NEAR(p->estimate(s.context(), 0), base + 100 * 0.02, 1e-9);
  EXPECT_EQ(p->pick(s.context())->worker, 1u);  // the worker with room
  s.workers[0].capacity_blocks = 0;  // a pool of unknown size is never waited for
  EXPECT_NEAR(p->estimate(s.context(), 0), base, 1e-12);
}

TEST(KvCost, CpuTierCostsTransferNotRecompute) {
  auto p = make("kv_cost");
  Scene s(2);
  for (auto& w : s.workers) {
    w.prefill_tokens_per_s = 1000;
    w.transfer_tokens_per_s = 10000;
  }
  s.match.blocks = {10, 10};
  s.match.cpu_blocks = {10, 0};
  EXPECT_EQ(p->pick(s.context())->worker, 1u);
  EXPECT_NEAR(p->estimate(s.context(), 0), 0.1, 1e-9);  // 1000 tokens at 10000/s
}

TEST(SessionAffinity, KeepsBoundWorkerWhilePoolHasRoomThenWithinMarginOnly) {
  PolicyOptions o;
  o.session_margin_s = 0.5;
  auto p = std::move(*make_policy("kv_cost", o));
  Scene s(2);
  for (auto& w : s.workers) {
    w.prefill_tokens_per_s = 1000;
    w.capacity_blocks = 1000;
  }
  s.match.blocks = {10, 0};
  s.context();
  s.ctx.preferred = 1;  // bound to the cold worker: 1 s against 0 s, more than the margin
  auto pick = p->pick(s.ctx);
  EXPECT_EQ(pick->worker, 1u);  // but its KV pool has room: the session stays
  EXPECT_EQ(pick->reason, Reason::kSession);
  s.workers[1].kv_usage = 0.95;  // 5,000 of its 100K tokens free hold the turn (1,000 prompt, 256 output): it stays
  EXPECT_EQ(p->pick(s.context())->worker, 1u);
  s.workers[1].kv_usage = 0.995;  // 500 free: no room for the turn, so the session may move, by more than the margin
  s.workers[1].inflight_kv_tokens = 50000;  // (what its requests in flight free as they end: the wait is short)
  EXPECT_EQ(p->pick(s.context())->worker, 0u);
  s.match.blocks = {10, 7};  // bound worker now 0.3 s: within the margin
  pick = p->pick(s.ctx);
  EXPECT_EQ(pick->worker, 1u);
  EXPECT_EQ(pick->reason, Reason::kSession);
  // A worker with 70 % of its running-sequence cap in flight does not take over a session.
  s.match.blocks = {10, 0};
  s.workers[0].max_running = 100;
  s.workers[0].in_flight = 70;
  pick = p->pick(s.context());
  EXPECT_EQ(pick->worker, 1u);
  EXPECT_EQ(pick->reason, Reason::kSession);
  s.workers[0].in_flight = 60;
  EXPECT_EQ(p->pick(s.context())->worker, 0u);
  // Prefix-blind policies keep a healthy bound worker.
  auto rr = std::move(*make_policy("round_robin", o));
  for (std::uint64_t seq = 0; seq < 4; ++seq) {
    s.ctx.sequence = seq;
    EXPECT_EQ(rr->pick(s.ctx)->worker, 1u);
  }
  s.workers[1].healthy = false;  // a bound worker that is down is replaced
  EXPECT_EQ(rr->pick(s.context())->worker, 0u);
}

// The other replicas' prefill on a worker is one queue: it drains at one second per second in the order its
// parts came (Lindley's recursion), not each part on its own, and the requests stay in flight.
TEST(RemoteLoad, DrainsAsOneQueue) {
  LoadShare a{1, 1000, 0, 0.010, 0.010};  // one request, 10 ms of prefill
  // Two requests routed at once: 20 ms of work; 15 ms later 5 ms are left.
  LoadShare both = queued_at({{0.0, a}, {0.0, a}}, 0.015);
  EXPECT_NEAR(both.pending_prefill_s, 0.005, 1e-12);
  EXPECT_EQ(both.pending_prefill_tokens, 500u);  // the tokens in proportion
  EXPECT_EQ(both.in_flight, 2u);
  // The second came when the first was done: only its own 10 ms, half of it left.
  LoadShare apart = queued_at({{0.020, a}, {0.0, a}}, 0.025);
  EXPECT_NEAR(apart.pending_prefill_s, 0.005, 1e-12);
  // Long done: nothing queued, still in flight (their decode is not drained).
  LoadShare old = queued_at({{0.0, a}}, 1.0);
  EXPECT_EQ(old.pending_prefill_s, 0.0);
  EXPECT_EQ(old.pending_prefill_tokens, 0u);
  EXPECT_EQ(old.oldest_prefill_s, 0.0);
  EXPECT_EQ(old.in_flight, 1u);
  // Time running backwards (parts learned after `now`) drains nothing.
  LoadShare early = a;
  early.drain(-1.0);
  EXPECT_EQ(early.pending_prefill_s, 0.010);
}

// The queue kv_cost reads behind a long prefill: total and oldest estimate by sending order, and the time since
// the last first token, which a request ending without one does not restart.
TEST(PrefillQueue, TotalOldestAndTimeSinceTheLastFirstToken) {
  PrefillQueue q;
  WorkerView v;
  q.fill(v, 5.0);
  EXPECT_EQ(v.pending_prefill_s, 0.0);
  q.add(1, 6.0, 10.0);
  q.add(2, 0.5, 11.0);
  q.add(3, 1.0, 12.0);
  q.fill(v, 13.0);
  EXPECT_DOUBLE_EQ(v.pending_prefill_s, 7.5);
  EXPECT_DOUBLE_EQ(v.oldest_prefill_s, 6.0);
  EXPECT_DOUBLE_EQ(v.prefill_elapsed_s, 3.0);  // since the queue started
  q.remove(1, /*first_token=*/true, 14.0);
  q.remove(2, /*first_token=*/false, 15.0);  // cancelled
  q.remove(9, /*first_token=*/false, 15.0);  // not queued: nothing happens
  q.fill(v, 16.0);
  EXPECT_DOUBLE_EQ(v.pending_prefill_s, 1.0);
  EXPECT_DOUBLE_EQ(v.oldest_prefill_s, 1.0);
  EXPECT_DOUBLE_EQ(v.prefill_elapsed_s, 2.0);  // since the first token at 14
  q.remove(3, /*first_token=*/true, 17.0);
  EXPECT_TRUE(q.empty());
  EXPECT_EQ(q.total_s(), 0.0);
}

// The tail kv_cost prices: a quantile of the last `window` values, recomputed every few additions, unknown
// (0) until enough values came.
TEST(RecentQuantile, QuantileOfTheLastWindowValues) {
  RecentQuantile q(/*window=*/100, /*q=*/0.97, /*every=*/10, /*min_values=*/50);
  for (int i = 0; i < 49; ++i) q.add(i);
  EXPECT_EQ(q.value(), 0.0);
  q.add(49);                       // 0..49: the 97th percentile is the 48th smallest (index 47)
  EXPECT_EQ(q.value(), 47.0);
  for (int i = 0; i < 100; ++i) q.add(1000 + i);  // the window holds only these now
  EXPECT_EQ(q.value(), 1096.0);
  for (int i = 0; i < 10; ++i) q.add(std::nan(""));  // not a value: ignored, nothing recomputed
  EXPECT_EQ(q.value(), 1096.0);
}

TEST(RecentMean, MeanOfTheLastWindowValues) {
  RecentMean m(/*window=*/4, /*min_values=*/2);
  m.add(1);
  EXPECT_EQ(m.value(), 0.0);  // fewer than min_values
  m.add(3);
  EXPECT_EQ(m.value(), 2.0);
  for (double v : {10.0, 20.0, 30.0, 40.0}) m.add(v);  // the window holds only these now
  EXPECT_EQ(m.value(), 25.0);
  m.add(std::nan(""));  // not a value: ignored
  EXPECT_EQ(m.value(), 25.0);
  m.add(50);  // 20..50
  EXPECT_EQ(m.value(), 35.0);
}

// Replicas take turns only in bursts: three requests at once at a replica, burst after burst, tell it that the
// others (7 more replicas) get as many at the same instant; rank 3 then waits three stream delays for a long
// prompt, not for a short one, and never when arrivals are far apart or it is the only replica.
TEST(BurstStagger, WaitsRankTimesTheStreamDelayOnlyInBursts) {
  constexpr double d = 0.002;
  BurstStagger bursty;
  double t = 0, last_wait = 0;
  for (int burst = 0; burst < 400; ++burst, t += 1.0) {
    for (int k = 0; k < 3; ++k) last_wait = bursty.arrive(t, /*rank=*/3, /*replicas=*/8, d, /*prefill_s=*/0.5);
  }
  // Within a burst 0, 1 and 2 own arrivals came before: 2 x 1 on average, times the 7 others.
  EXPECT_NEAR(bursty.concurrent(), 14.0, 0.5);
  EXPECT_DOUBLE_EQ(last_wait, 3 * d);
  EXPECT_DOUBLE_EQ(bursty.arrive(t, 3, 8, d, /*prefill_s=*/0.0005), 0.0);  // 7 x 0.0005 < 0.006: not worth it
  EXPECT_DOUBLE_EQ(bursty.arrive(t, /*rank=*/0, 8, d, 0.5), 0.0);           // the first takes its turn at once
  EXPECT_DOUBLE_EQ(bursty.arrive(t, 3, /*replicas=*/1, d, 0.5), 0.0);       // alone: nobody to wait for

  BurstStagger spread;  // one arrival every 50 ms: never two within a stream delay
  for (int i = 0; i < 400; ++i, t += 0.05) EXPECT_DOUBLE_EQ(spread.arrive(t, 3, 8, d, 0.5), 0.0);
  EXPECT_DOUBLE_EQ(spread.concurrent(), 0.0);

  // Bursts that stop: the estimate decays with the arrivals that follow.
  for (int i = 0; i < 400; ++i, t += 0.05) bursty.arrive(t, 3, 8, d, 0.5);
  EXPECT_LT(bursty.concurrent(), 0.05);
}

}  // namespace
}  // namespace kvroute::policy
