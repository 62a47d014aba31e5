// RouterMetrics: the series an operator's queries and alerts depend on exist before the first event, unknown
// values read as NaN rather than 0, and each new method counts what its name says.
#include "router/metrics.h"

#include <cmath>
#include <string>

#include <gtest/gtest.h>

namespace kvroute::router {
namespace {

// The value of the sample whose name and labels are `series` exactly (e.g. `x_total{kind="a"}`); -1 if absent.
double sample(const std::string& text, const std::string& series) {
  const auto at = text.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + series.size() + 2));
}

TEST(RouterMetrics, LabelledCountersExistAtZeroBeforeTheirFirstEvent) {
  RouterMetrics m;
  const std::string t = m.serialize();
  for (const char* kind : {"bad_request", "client_disconnected", "accept", "fleet_saturated", "no_healthy_worker",
                           "upstream", "worker_rejected"}) {
    EXPECT_EQ(sample(t, std::string("kvroute_errors_total{kind=\"") + kind + "\"}"), 0) << kind;
  }
  for (const char* reason : {"prefix_hit", "session", "load_fallback", "cold", "only_choice", "previous_response"}) {
    EXPECT_EQ(sample(t, std::string("kvroute_routing_decisions_total{reason=\"") + reason + "\"}"), 0) << reason;
  }
  EXPECT_EQ(sample(t, "kvroute_retries_total{kind=\"reroute\"}"), 0);
  EXPECT_EQ(sample(t, "kvroute_tokenize_total{outcome=\"fallback\"}"), 0);
  // With no worker at all, the fleet's size is there to alert on.
  EXPECT_EQ(sample(t, "kvroute_workers"), 0);
  EXPECT_EQ(sample(t, "kvroute_workers_healthy"), 0);
  EXPECT_EQ(sample(t, "kvroute_fleet_prefill_seconds_saved_total"), 0);
  EXPECT_NE(t.find("kvroute_build_info{"), std::string::npos);
  EXPECT_GT(sample(t, "process_resident_memory_bytes"), 0);
  EXPECT_GT(sample(t, "process_open_fds"), 0);
  EXPECT_GT(sample(t, "process_start_time_seconds"), 1.7e9);
}

TEST(RouterMetrics, UnknownLoadIsNaNNotZero) {
  RouterMetrics m;
  m.add_worker(3, "10.0.0.7:8000");
  std::string t = m.serialize();
  EXPECT_TRUE(std::isnan(sample(t, "kvroute_worker_kv_usage{worker=\"10.0.0.7:8000\"}")));
  EXPECT_TRUE(std::isnan(sample(t, "kvroute_worker_running{worker=\"10.0.0.7:8000\"}")));
  m.worker_load(3, 2, 5, 0.25);
  t = m.serialize();
  EXPECT_EQ(sample(t, "kvroute_worker_kv_usage{worker=\"10.0.0.7:8000\"}"), 0.25);
  EXPECT_EQ(sample(t, "kvroute_worker_waiting{worker=\"10.0.0.7:8000\"}"), 5);
  m.worker_load(3, std::nullopt, std::nullopt, std::nullopt);  // its polls went stale
  EXPECT_TRUE(std::isnan(sample(m.serialize(), "kvroute_worker_kv_usage{worker=\"10.0.0.7:8000\"}")));
  m.remove_worker(3);
  EXPECT_EQ(m.serialize().find("10.0.0.7:8000"), std::string::npos);  // no series left behind
}

TEST(RouterMetrics, WorkerStatusesCountWhereTheyBelong) {
  RouterMetrics m;
  m.add_worker(0, "w:1");
  m.upstream_status(0, 404);  // an unknown model: the client's request refused
  m.upstream_status(0, 503);
  m.upstream_status(0, 200);
  m.worker_failure(0, RouterMetrics::WorkerFailure::kConnect);
  m.ttft(0, 0.2, 500);  // an error body's first byte is no token
  m.ttft(0, 0.3, 200);
  m.rerouted();
  const std::string t = m.serialize();
  EXPECT_EQ(sample(t, "kvroute_errors_total{kind=\"worker_rejected\"}"), 1);
  EXPECT_EQ(sample(t, "kvroute_errors_total{kind=\"upstream\"}"), 0);  // counted per request by the router
  EXPECT_EQ(sample(t, "kvroute_worker_errors_total{class=\"4xx\",worker=\"w:1\"}"), 1);
  EXPECT_EQ(sample(t, "kvroute_worker_errors_total{class=\"5xx\",worker=\"w:1\"}"), 1);
  EXPECT_EQ(sample(t, "kvroute_worker_errors_total{class=\"connect\",worker=\"w:1\"}"), 1);
  EXPECT_EQ(sample(t, "kvroute_ttft_seconds_count{worker=\"w:1\"}"), 1);
  EXPECT_EQ(sample(t, "kvroute_retries_total{kind=\"reroute\"}"), 1);
}

TEST(RouterMetrics, CachedTokensArePricedAtTheWorkersPrefillRate) {
  RouterMetrics m;
  m.add_worker(0, "a:1");
  m.add_worker(1, "b:1");
  m.worker(0)->reported_cached_tokens->Increment(20000);
  m.worker(1)->reported_cached_tokens->Increment(5000);
  m.sync_prefill_saved(0, 10000);  // 20,000 tokens at 10,000 tokens/s
  m.sync_prefill_saved(1, 5000);
  m.sync_prefill_saved(0, 10000);  // nothing new
  std::string t = m.serialize();
  EXPECT_DOUBLE_EQ(sample(t, "kvroute_prefill_seconds_saved_total{worker=\"a:1\"}"), 2);
  EXPECT_DOUBLE_EQ(sample(t, "kvroute_prefill_seconds_saved_total{worker=\"b:1\"}"), 1);
  EXPECT_DOUBLE_EQ(sample(t, "kvroute_fleet_prefill_seconds_saved_total"), 3);
  m.remove_worker(1);
  EXPECT_DOUBLE_EQ(sample(m.serialize(), "kvroute_fleet_prefill_seconds_saved_total"), 3);  // the fleet keeps it
}

TEST(RouterMetrics, KvEventCountersFollowTheSubscriber) {
  RouterMetrics m;
  m.add_worker(0, "a:1");
  EXPECT_TRUE(std::isnan(sample(m.serialize(), "kvroute_kv_events_last_message_age_seconds{worker=\"a:1\"}")));
  m.sync_kv_events(0, KvEventCounts{100, 2, 1, 0, 0, 0.5, 0.004});
  m.sync_kv_events(0, KvEventCounts{150, 3, 2, 1, 1, 0.1, 0.003});
  m.sync_kv_events(0, KvEventCounts{10, 0, 0, 0, 0, 0.2, 0.002});  // a new subscriber starts from 0
  const std::string t = m.serialize();
  EXPECT_EQ(sample(t, "kvroute_kv_events_messages_total{worker=\"a:1\"}"), 160);
  EXPECT_EQ(sample(t, "kvroute_kv_events_gaps_total{worker=\"a:1\"}"), 3);
  EXPECT_EQ(sample(t, "kvroute_kv_events_replays_total{worker=\"a:1\"}"), 2);
  EXPECT_EQ(sample(t, "kvroute_kv_events_malformed_total{worker=\"a:1\"}"), 1);
  EXPECT_EQ(sample(t, "kvroute_kv_events_restarts_total{worker=\"a:1\"}"), 1);
  EXPECT_EQ(sample(t, "kvroute_kv_events_last_message_age_seconds{worker=\"a:1\"}"), 0.2);
  EXPECT_EQ(sample(t, "kvroute_kv_events_lag_seconds{worker=\"a:1\"}"), 0.002);
}

TEST(RouterMetrics, CollectHookRunsBeforeEverySerialize) {
  RouterMetrics m;
  int calls = 0;
  m.on_collect([&] {
    ++calls;
    m.set_workers(4, 3, 2);
  });
  const std::string t = m.serialize();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(sample(t, "kvroute_workers"), 4);
  EXPECT_EQ(sample(t, "kvroute_workers_healthy"), 3);
  EXPECT_EQ(sample(t, "kvroute_workers_routable"), 2);
}

}  // namespace
}  // namespace kvroute::router
