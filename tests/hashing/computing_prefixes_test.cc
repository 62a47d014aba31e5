#include "hashing/computing_prefixes.h"

#include <gtest/gtest.h>

#include <limits>
#include <optional>

namespace kvroute::hashing {
namespace {

// The token of the request computing `block` as block `pos` on `worker` (ComputingPrefixes::leader), if any.
std::optional<ComputingPrefixes::Token> computing(const ComputingPrefixes& c, WorkerId worker, std::size_t pos,
                                                  BlockHash block) {
  const auto l = c.leader(worker, pos, block);
  return l ? std::optional<ComputingPrefixes::Token>(l->token) : std::nullopt;
}

TEST(ComputingPrefixes, FindsTheEarliestRequestComputingABlockUntilItsFirstToken) {
  ComputingPrefixes c;
  const std::vector<BlockHash> a{11, 12, 13, 14};
  const std::vector<BlockHash> b{11, 12, 13, 14, 15, 16};
  // a computes blocks 1..3 on worker 2 (block 0 was cached); b, sent after it, computes 4..5.
  const auto ta = c.begin(2, a, 1);
  const auto tb = c.begin(2, b, 4);
  ASSERT_NE(ta, 0u);
  ASSERT_NE(tb, 0u);
  EXPECT_EQ(c.size(2), 2u);
  EXPECT_EQ(computing(c, 2, 3, 14), ta);            // a prefix of four blocks: a computes its last one
  EXPECT_EQ(computing(c, 2, 5, 16), tb);
  EXPECT_FALSE(computing(c, 2, 0, 11));             // cached before a came
  EXPECT_FALSE(computing(c, 2, 2, 14));             // another position: another prefix
  EXPECT_FALSE(computing(c, 1, 3, 14));             // another worker
  EXPECT_FALSE(computing(c, 7, 3, 14));             // a worker never seen
  EXPECT_TRUE(c.active(2, ta));
  c.end(2, ta);                                    // a's first token
  EXPECT_FALSE(c.active(2, ta));
  EXPECT_FALSE(computing(c, 2, 3, 14));
  EXPECT_EQ(computing(c, 2, 5, 16), tb);
  c.end(2, tb);
  c.end(2, tb);  // again, and the "nothing registered" token: no-ops
  c.end(2, 0);
  EXPECT_EQ(c.size(2), 0u);
}

// The request computing a block: its token, where its computation begins and when its prefill was expected to start
// (the prefix hold asks whether a later request could still be admitted with it: policy::prefix_hold_pays).
TEST(ComputingPrefixes, KnowsWhereARequestsComputationBeginsAndWhenItsPrefillStarts) {
  ComputingPrefixes c;
  const std::vector<BlockHash> a{31, 32, 33, 34};
  const auto queued = c.begin(0, a, 1, 2.0, 2.5);  // 0.5 s of prefill queued ahead of it when sent
  const auto idle = c.begin(1, a, 2, 3.0);         // nothing ahead: it starts when sent
  c.begin(2, a, 0, 4.0, 1.0);                      // never before it is sent
  ASSERT_TRUE(c.leader(0, 3, 34));
  EXPECT_EQ(c.leader(0, 3, 34)->token, queued);
  EXPECT_EQ(c.leader(0, 3, 34)->from, 1u);
  EXPECT_EQ(c.leader(0, 3, 34)->starts_at, 2.5);
  EXPECT_EQ(c.leader(1, 3, 34)->token, idle);
  EXPECT_EQ(c.leader(1, 3, 34)->from, 2u);
  EXPECT_EQ(c.leader(1, 3, 34)->starts_at, 3.0);
  EXPECT_EQ(c.leader(2, 3, 34)->starts_at, 4.0);
  EXPECT_FALSE(c.leader(4, 3, 34));  // a worker computing nothing
  // Another replica's request: when its prefill starts is not known here.
  c.begin_elsewhere(3, a, 1, 5.0);
  EXPECT_EQ(c.leader(3, 3, 34)->starts_at, std::numeric_limits<double>::infinity());
  c.end(0, queued);
  EXPECT_FALSE(c.leader(0, 3, 34));
}

TEST(ComputingPrefixes, AnotherReplicasRequestComputesUntilTheWorkerStoresItsLastBlock) {
  ComputingPrefixes c;
  const std::vector<BlockHash> a{21, 22, 23};
  // Another router replica sent a to worker 1 at t = 10 s; it computes blocks 1..2 there.
  const auto ta = c.begin_elsewhere(1, a, 1, 10.0);
  ASSERT_NE(ta, 0u);
  EXPECT_EQ(computing(c, 1, 2, 23), ta);
  c.stored(1, std::vector<BlockHash>{22}, 10.2);  // not its last block yet
  EXPECT_TRUE(c.active(1, ta));
  c.stored(1, std::vector<BlockHash>{23}, 10.3);  // computed: this replica never sees its first token
  EXPECT_FALSE(c.active(1, ta));
  EXPECT_FALSE(computing(c, 1, 2, 23));
  // One whose store event never comes goes once it is older than kElsewhereTtl.
  const auto tb = c.begin_elsewhere(1, a, 1, 20.0);
  EXPECT_TRUE(c.active(1, tb));
  c.begin_elsewhere(1, std::vector<BlockHash>{31, 32}, 0, 20.0 + ComputingPrefixes::kElsewhereTtl + 1);
  EXPECT_FALSE(c.active(1, tb));
  EXPECT_EQ(c.size(1), 1u);
}

// A first token before the worker's event stored the request's last block is news for the other replicas: the
// sender is told that block, and the others' entries for it end when they hear of it.
TEST(ComputingPrefixes, AFirstTokenBeforeTheEventReachesTheOtherReplicasEntries) {
  ComputingPrefixes sender, other;
  const std::vector<BlockHash> a{41, 42, 43};
  const auto mine = sender.begin(3, a, 1, 5.0);
  const auto theirs = other.begin_elsewhere(3, a, 1, 5.0);
  const auto unrelated = other.begin_elsewhere(3, std::vector<BlockHash>{41, 42, 44}, 1, 5.0);
  const auto own = other.begin(3, a, 1, 5.0);  // the other replica's own request for the same blocks
  EXPECT_EQ(sender.first_token(3, mine, 5.2), BlockHash{43});
  EXPECT_EQ(other.computed_elsewhere(3, 43), std::vector<ComputingPrefixes::Token>{theirs});
  EXPECT_FALSE(other.active(3, theirs));
  EXPECT_TRUE(other.active(3, unrelated));
  EXPECT_TRUE(other.active(3, own));  // its own first token ends it
  EXPECT_TRUE(other.computed_elsewhere(3, 43).empty());
  EXPECT_TRUE(other.computed_elsewhere(9, 43).empty());  // a worker never seen
  // Stored before the first token (an engine that stores blocks when it schedules them): the event told everyone.
  const auto next = sender.begin(3, a, 1, 6.0);
  sender.stored(3, std::vector<BlockHash>{43}, 6.1);
  EXPECT_FALSE(sender.first_token(3, next, 6.2));
  EXPECT_FALSE(sender.first_token(3, next, 6.2));  // ended already
  // An event dated after the first token (kvroute-bench applies an event when the engine emits it, dated when it
  // reaches the router) has not stored it yet.
  const auto late = sender.begin(3, a, 1, 7.0);
  sender.stored(3, std::vector<BlockHash>{43}, 7.3);
  EXPECT_EQ(sender.first_token(3, late, 7.2), BlockHash{43});
}

TEST(ComputingPrefixes, TwoRequestsComputingTheSameBlockAnswerTheFirst) {
  ComputingPrefixes c;
  const std::vector<BlockHash> chain{1, 2, 3};
  const auto first = c.begin(0, chain, 0);
  const auto second = c.begin(0, chain, 0);
  EXPECT_EQ(computing(c, 0, 2, 3), first);
  c.end(0, first);
  EXPECT_EQ(computing(c, 0, 2, 3), second);
}

TEST(ComputingPrefixes, AFullyCachedRequestComputesNothing) {
  ComputingPrefixes c;
  const std::vector<BlockHash> chain{1, 2};
  EXPECT_EQ(c.begin(0, chain, 2), 0u);
  EXPECT_EQ(c.begin(0, {}, 0), 0u);
  EXPECT_EQ(c.size(0), 0u);
}

// A chain of n blocks, distinct per seed.
std::vector<BlockHash> blocks(std::size_t n, BlockHash seed) {
  std::vector<BlockHash> c(n);
  for (std::size_t i = 0; i < n; ++i) c[i] = seed * 100000 + i;
  return c;
}

TEST(ComputingPrefixes, FirstTokensOfOneChunkPrefillsTeachWhenAWorkerCommitsBlocks) {
  ComputingPrefixes c;
  using Commit = ComputingPrefixes::Commit;
  // A request computing `n` blocks, sent at 0, its last block stored at `stored_at` (< 0: never), its first
  // token at 1.0: stored at 0.75 or before means at schedule.
  auto prefill = [&](WorkerId w, std::size_t n, BlockHash seed, double stored_at) {
    const auto chain = blocks(n, seed);
    const auto t = c.begin(w, chain, 0, /*now=*/0.0);
    if (stored_at >= 0) c.stored(w, std::span(chain).last(1), stored_at);
    c.first_token(w, t, 1.0);
  };
  EXPECT_EQ(c.commit(0), Commit::kUnknown);
  EXPECT_TRUE(c.holds_help(0));  // until shown otherwise
  // Prefills outside 256-512 computed blocks teach nothing.
  prefill(0, 200, 1, 0.2);
  prefill(0, 600, 2, 0.2);
  EXPECT_EQ(c.commit(0), Commit::kUnknown);
  EXPECT_EQ(c.size(0), 0u);
  // Stored 0.8 s before the first token: when scheduled (vLLM v1); no holds there.
  prefill(0, 300, 3, 0.2);
  EXPECT_EQ(c.commit(0), Commit::kAtSchedule);
  EXPECT_FALSE(c.holds_help(0));
  // The margin is a quarter of the time since dispatch: sent at 0.9, stored at 0.92, first token at 1.0.
  {
    const auto chain = blocks(300, 7);
    const auto t = c.begin(0, chain, 0, 0.9);
    c.stored(0, std::span(chain).last(1), 0.92);
    c.first_token(0, t, 1.0);
  }
  EXPECT_EQ(c.commit(0), Commit::kAtSchedule);
  // Stored within the margin of the first token (the event and the token raced), then not at all: after
  // the step.
  prefill(0, 300, 4, 0.9);
  prefill(0, 300, 5, -1);
  EXPECT_EQ(c.commit(0), Commit::kUnknown);  // two each way
  prefill(0, 300, 8, -1);
  EXPECT_EQ(c.commit(0), Commit::kAfterStep);
  EXPECT_TRUE(c.holds_help(0));
  EXPECT_EQ(c.commit(1), Commit::kUnknown);  // per worker
  // Blocks stored that are not a request's last, or on another worker, say nothing of it.
  {
    const auto chain = blocks(300, 6);
    const auto t = c.begin(0, chain, 0);
    c.stored(0, std::span(chain).first(10), 0.1);
    c.stored(1, std::span(chain).last(1), 0.1);
    c.first_token(0, t, 1.0);
  }
  EXPECT_EQ(c.commit(0), Commit::kAfterStep);
  // Evidence saturates at three either way, so a worker that changes shows it within a few prefills.
  for (int i = 0; i < 10; ++i) prefill(0, 300, 10 + i, -1);
  for (int i = 0; i < 3; ++i) prefill(0, 300, 30 + i, 0.1);
  EXPECT_EQ(c.commit(0), Commit::kUnknown);
  prefill(0, 300, 40, 0.1);
  EXPECT_EQ(c.commit(0), Commit::kAtSchedule);
  // A removed worker's id starts over.
  const auto open = c.begin(0, blocks(300, 50), 0);
  c.forget(0);
  EXPECT_EQ(c.commit(0), Commit::kUnknown);
  EXPECT_FALSE(c.active(0, open));
}

}  // namespace
}  // namespace kvroute::hashing
