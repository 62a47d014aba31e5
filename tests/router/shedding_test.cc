// Load shedding in Router::route: a sheddable request is refused (429) while no worker that could serve it
// has room; other requests are routed as always.
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "router/router.h"

namespace kvroute::router {
namespace {

class SheddingTest : public testing::Test {
 protected:
  SheddingTest() {
    config_.policy = "least_request";
    config_.worker_max_seqs = 4;
    config_.shed_queue_depth = 2;
    config_.shed_kv_usage = 0.8;
    // The router first: it hears of the workers as they are added.
    router_ = std::make_unique<Router>(config_, registry_, std::move(*policy::make_policy("least_request", {})), metrics_);
    for (int i = 0; i < 2; ++i) {
      auto ep = backends::parse_worker_url("http://10.0.0." + std::to_string(i + 1) + ":8000");
      EXPECT_TRUE(ep && registry_.add(*ep));
    }
  }
  // Telemetry as the worker's /metrics would report it.
  void report(int worker, std::uint32_t waiting, double kv_usage) {
    backends::WorkerTelemetry t;
    t.waiting = waiting;
    t.kv_usage = kv_usage;
    t.valid = true;
    registry_.find(static_cast<hashing::WorkerId>(worker))->set_telemetry(t);
  }
  Result<Decision> route(const std::string& body, std::string_view priority = {}) {
    auto parsed = parse_request(Endpoint::kCompletions, body, RequestHeaders{{}, {}, priority}, ParseOptions{});
    EXPECT_TRUE(parsed) << parsed.error().message;
    return router_->route(*parsed);
  }
  static constexpr const char* kBody = R"({"model":"m","prompt":"hello","max_tokens":4})";
  static constexpr const char* kFlex = R"({"model":"m","prompt":"hello","max_tokens":4,"service_tier":"flex"})";

  Config config_;
  backends::WorkerRegistry registry_;
  RouterMetrics metrics_;
  std::unique_ptr<Router> router_;
};

TEST_F(SheddingTest, ASheddableRequestIsRefusedOnlyWhileEveryWorkerIsSaturated) {
  report(0, 2, 0.1);  // a waiting queue at the threshold
  report(1, 0, 0.5);
  auto d = route(kBody, "sheddable");
  ASSERT_TRUE(d);  // worker 1 has room, and gets it
  EXPECT_EQ(d->worker->id(), 1);
  router_->complete(*d, Outcome{true, std::nullopt});

  report(1, 0, 0.8);  // its KV cache at the threshold: now both are saturated
  auto shed = route(kBody, "Sheddable");
  ASSERT_FALSE(shed);
  EXPECT_EQ(shed.error().status, 429);
  EXPECT_EQ(shed.error().code, "fleet_saturated");
  EXPECT_NE(shed.error().message.find("2 or more requests waiting, or 80 % or more of its KV cache"), std::string::npos)
      << shed.error().message;
  EXPECT_FALSE(route(kFlex));  // OpenAI's flex tier is sheddable too

  // A request that is not sheddable is routed all the same.
  auto normal = route(kBody);
  ASSERT_TRUE(normal);
  router_->complete(*normal, Outcome{true, std::nullopt});
  auto standard = route(kBody, "critical");
  ASSERT_TRUE(standard);
  router_->complete(*standard, Outcome{true, std::nullopt});

  report(0, 1, 0.79);  // room again
  EXPECT_TRUE(route(kFlex));
}

TEST_F(SheddingTest, BetweenPollsTheRoutersOwnCountShowsAFullWorker) {
  // Nothing waiting as last polled, but a worker the router has sent its running cap (4) plus the queue
  // depth (2) has no room: 6 requests each, 12 in all.
  report(0, 0, 0.1);
  report(1, 0, 0.1);
  std::vector<Decision> sent;
  for (int i = 0; i < 11; ++i) {
    auto d = route(kBody);
    ASSERT_TRUE(d);
    sent.push_back(std::move(*d));
  }
  auto last = route(kBody, "sheddable");  // the last free slot
  ASSERT_TRUE(last);
  sent.push_back(std::move(*last));
  EXPECT_FALSE(route(kBody, "sheddable"));
  router_->complete(sent.back(), Outcome{true, std::nullopt});
  sent.pop_back();
  auto again = route(kBody, "sheddable");
  ASSERT_TRUE(again);
  sent.push_back(std::move(*again));
  for (auto& d : sent) router_->complete(d, Outcome{true, std::nullopt});
}

TEST_F(SheddingTest, NoHealthyWorkerIsNotSaturation) {
  for (int i = 0; i < 2; ++i) registry_.find(static_cast<hashing::WorkerId>(i))->set_healthy(false);
  auto d = route(kBody, "sheddable");
  ASSERT_FALSE(d);
  EXPECT_EQ(d.error().status, 503);
}

}  // namespace
}  // namespace kvroute::router
