// RelayObserver: what the relay reads out of a worker's response (usage, the usage event the router added and
// removes, a stored response's id, the first token), with a real Router and worker registry.
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "router/relay_observer.h"

namespace kvroute::router {
namespace {

class RelayObserverTest : public testing::Test {
 protected:
  void SetUp() override {
    router_ = std::make_unique<Router>(config_, registry_, std::move(*policy::make_policy("round_robin", {})), metrics_);
    auto ep = backends::parse_worker_url("http://10.0.0.1:8000");
    ASSERT_TRUE(ep && registry_.add(*ep));
    worker_ = registry_.find(0);
    observer_ = std::make_unique<RelayObserver>(*router_, decision_);
  }
  // Feeds `body` in pieces of `piece` bytes; returns what would be relayed.
  std::string relay(const std::string& body, std::size_t piece) {
    std::string out;
    for (std::size_t at = 0; at < body.size(); at += piece) {
      const bool last = at + piece >= body.size();
      out += observer_->on_body(std::string_view(body).substr(at, piece), last);
    }
    return out;
  }

  Config config_;
  backends::WorkerRegistry registry_;
  RouterMetrics metrics_;
  std::unique_ptr<Router> router_;
  std::shared_ptr<backends::Worker> worker_;
  std::optional<Decision> decision_;
  std::unique_ptr<RelayObserver> observer_;
};

const std::string kTokens = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n";
const std::string kUsage =
    "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2,\"total_tokens\":11}}\n\n";
const std::string kDone = "data: [DONE]\n\n";

TEST_F(RelayObserverTest, TheUsageEventTheRouterAddedIsRemovedAndRead) {
  observer_->begin(/*responses=*/false, /*strip_usage=*/true);
  EXPECT_TRUE(observer_->on_head(200, /*event_stream=*/true, *worker_, "r1"));  // the length changes
  // Pieces that cut events in two: only whole events go on.
  EXPECT_EQ(relay(kTokens + kUsage + kDone, 7), kTokens + kDone);
  ASSERT_TRUE(observer_->usage());
  EXPECT_EQ(observer_->usage()->prompt_tokens, 9u);
  EXPECT_EQ(observer_->usage()->completion_tokens, 2u);
}

TEST_F(RelayObserverTest, AStreamTheClientAskedUsageForPassesUnchanged) {
  observer_->begin(false, /*strip_usage=*/false);
  EXPECT_FALSE(observer_->on_head(200, true, *worker_, "r2"));
  EXPECT_EQ(relay(kTokens + kUsage + kDone, 5), kTokens + kUsage + kDone);
  ASSERT_TRUE(observer_->usage());  // read from the stream's end
  EXPECT_EQ(observer_->usage()->prompt_tokens, 9u);
}

TEST_F(RelayObserverTest, ANewExchangeForgetsTheLastOnesUsage) {
  observer_->begin(false, false);
  observer_->on_head(200, false, *worker_, "r3");
  relay(R"({"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}})", 64);
  ASSERT_TRUE(observer_->usage());
  observer_->begin(false, false);
  EXPECT_FALSE(observer_->usage());
}

TEST_F(RelayObserverTest, AStoredResponsesIdIsRememberedWithItsWorker) {
  observer_->begin(/*responses=*/true, false);
  observer_->on_head(200, false, *worker_, "r4");
  relay(R"({"id":"resp_abc123","object":"response","status":"completed","output":[]})", 10);
  ASSERT_TRUE(router_->response_owner("resp_abc123"));
  EXPECT_EQ(*router_->response_owner("resp_abc123"), worker_->id());
}

TEST_F(RelayObserverTest, TheFirstPieceIsTheRoutedRequestsFirstByte) {
  auto parsed = parse_request(Endpoint::kCompletions, R"({"model":"m","prompt":"hello there","stream":true})",
                              RequestHeaders{}, ParseOptions{});
  ASSERT_TRUE(parsed);
  auto d = router_->route(*parsed);
  ASSERT_TRUE(d);
  decision_ = std::move(*d);
  observer_->begin(false, false);
  observer_->on_head(200, true, *worker_, "r5");
  EXPECT_FALSE(decision_->first_byte_seen);
  observer_->on_body(kTokens, false);
  EXPECT_TRUE(decision_->first_byte_seen);
  router_->complete(*decision_, Outcome{true, observer_->usage()});
}

// The worker's load ends with the last piece of its response, before that piece is written to the client: a
// client sending its next request the moment it has read this one finds the worker free (a conversation's next
// turn is not priced against its last one). complete() then ends it only once.
TEST_F(RelayObserverTest, TheLoadOnTheWorkerEndsWithTheLastPieceOfItsResponse) {
  auto parsed = parse_request(Endpoint::kCompletions, R"({"model":"m","prompt":"hello there"})", RequestHeaders{},
                              ParseOptions{});
  ASSERT_TRUE(parsed);
  auto d = router_->route(*parsed);
  ASSERT_TRUE(d);
  decision_ = std::move(*d);
  EXPECT_EQ(worker_->in_flight(), 1u);
  observer_->begin(false, false);
  observer_->on_head(200, false, *worker_, "r6");
  observer_->on_body(R"({"choices":[{"text":"hi"}],)", false);
  EXPECT_EQ(worker_->in_flight(), 1u);
  observer_->on_body(R"("usage":{"prompt_tokens":2,"completion_tokens":1,"total_tokens":3}})", true);
  EXPECT_EQ(worker_->in_flight(), 0u);
  EXPECT_EQ(worker_->view().pending_prefill_tokens, 0u);
  router_->complete(*decision_, Outcome{true, observer_->usage()});
  EXPECT_EQ(worker_->in_flight(), 0u);
  EXPECT_EQ(worker_->view().active_decode_tokens, 0u);
}

}  // namespace
}  // namespace kvroute::router
