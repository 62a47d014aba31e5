#include "backends/health_checker.h"
#include "backends/worker_registry.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace kvroute::backends {
namespace {

TEST(WorkerUrl, ParsesAndCanonicalizes) {
  auto a = parse_worker_url("http://127.0.0.1:8001/");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, "8001");
  EXPECT_EQ(a->url, "http://127.0.0.1:8001");
  auto b = parse_worker_url("[::1]:9000");
  ASSERT_TRUE(b);
  EXPECT_EQ(b->host, "::1");
  EXPECT_EQ(b->name, "[::1]:9000");
  EXPECT_EQ(parse_worker_url("http://h")->port, "80");
  EXPECT_FALSE(parse_worker_url("https://h:1"));
  EXPECT_FALSE(parse_worker_url("http://h:1/v1"));
  EXPECT_FALSE(parse_worker_url("http://:1"));
  EXPECT_FALSE(parse_worker_url("http://h:0"));
}

TEST(WorkerRegistry, AddRemoveNotifiesAndReusesIds) {
  WorkerRegistry reg;
  std::vector<std::string> events;
  reg.subscribe({[&](const Worker& w) { events.push_back("+" + w.name()); },
                 [&](const Worker& w) { events.push_back("-" + w.name()); },
                 {}});
  auto a = reg.add(*parse_worker_url("http://a:1"));
  auto b = reg.add(*parse_worker_url("http://b:1"));
  ASSERT_TRUE(a && b);
  EXPECT_EQ(*a, 0);
  EXPECT_EQ(*b, 1);
  EXPECT_FALSE(reg.add(*parse_worker_url("http://a:1/")));  // duplicate
  auto before = reg.snapshot();
  EXPECT_TRUE(reg.remove(*a));
  EXPECT_FALSE(reg.remove(*a));
  EXPECT_EQ(before->size(), 2u);  // an old snapshot stays valid
  EXPECT_EQ(reg.snapshot()->size(), 1u);
  EXPECT_EQ(*reg.add(*parse_worker_url("http://c:1")), 0);  // the freed id is reused
  EXPECT_EQ(events, (std::vector<std::string>{"+a:1", "+b:1", "-a:1", "+c:1"}));
}

// Router replicas share the operator's changes and nothing else: listeners hear who made each one.
TEST(WorkerRegistry, CordonsAndRemovalsSayWhoMadeThem) {
  WorkerRegistry reg;
  std::vector<std::string> events;
  reg.subscribe({{},
                 [&](const Worker& w) { events.push_back("-" + w.name() + (w.removed_by() == Origin::kOperator ? "" : "!")); },
                 [&](const Worker& w, bool c, Origin by) {
                   events.push_back((c ? "c" : "u") + w.name() + (by == Origin::kOperator ? "" : "!"));
                 }});
  auto a = reg.add(*parse_worker_url("http://a:1"));
  auto b = reg.add(*parse_worker_url("http://b:1"));
  ASSERT_TRUE(a && b);
  auto wa = reg.find(*a);
  wa->set_cordoned(true);
  wa->set_cordoned(true);  // no change, nothing told
  wa->set_cordoned(false, Origin::kShared);
  reg.remove(*a);
  reg.remove(*b, Origin::kDiscovery);
  EXPECT_EQ(events, (std::vector<std::string>{"ca:1", "ua:1!", "-a:1", "-b:1!"}));
  EXPECT_EQ(parse_worker_url("http://c:1")->origin, Origin::kOperator);
}

// The admin API names a worker by its display name or its id.
TEST(WorkerRegistry, FindsAWorkerByNameOrId) {
  WorkerRegistry reg;
  ASSERT_TRUE(reg.add(*parse_worker_url("http://a:1")));
  auto b = reg.add(*parse_worker_url("http://b:2"));
  ASSERT_TRUE(b);
  ASSERT_NE(reg.find_by_name("b:2"), nullptr);
  EXPECT_EQ(reg.find_by_name("b:2")->id(), *b);
  ASSERT_NE(reg.find_by_name(std::to_string(*b)), nullptr);
  EXPECT_EQ(reg.find_by_name(std::to_string(*b))->name(), "b:2");
  EXPECT_EQ(reg.find_by_name("c:3"), nullptr);
  EXPECT_EQ(reg.find_by_name("http://b:2"), nullptr);  // a URL is not a name
}

TEST(Worker, LoadAccountingBalances) {
  Worker w(0, *parse_worker_url("http://a:1"));
  const auto a = w.begin(100, 0.5);
  const auto b = w.begin(50, 0.25);
  auto v = w.view();
  EXPECT_EQ(v.in_flight, 2u);
  EXPECT_EQ(v.pending_prefill_tokens, 150u);
  EXPECT_DOUBLE_EQ(v.pending_prefill_s, 0.75);
  w.first_token(a, 100, 400);
  v = w.view();
  EXPECT_EQ(v.pending_prefill_tokens, 50u);
  EXPECT_DOUBLE_EQ(v.pending_prefill_s, 0.25);
  EXPECT_EQ(v.active_decode_tokens, 400u);
  w.end(a, true, 100, 400);
  w.end(b, false, 50, 70);
  v = w.view();
  EXPECT_EQ(v.in_flight, 0u);
  EXPECT_EQ(v.pending_prefill_tokens, 0u);
  EXPECT_EQ(v.pending_prefill_s, 0.0);
  EXPECT_EQ(v.active_decode_tokens, 0u);
}

// A report of 2 running and 1 waiting, then a request of this replica and one of another replica end: the view
// counts both as no longer running, the waiting one admitted in the place of the first. A later report is
// taken as it comes.
TEST(Worker, AReportCountsNoRequestThatEndedSinceItWasAskedFor) {
  Worker w(0, *parse_worker_url("http://a:1"));
  const auto a = w.begin(100, 0.5);
  WorkerTelemetry t;
  t.running = 2;
  t.waiting = 1;
  t.valid = true;
  t.ended_at_report = w.ended();
  w.set_telemetry(t);
  EXPECT_EQ(w.view().running, 2u);
  w.end(a, true, 100, 400);
  auto v = w.view();
  EXPECT_EQ(v.running, 2u);
  EXPECT_EQ(v.waiting, 0u);
  w.set_others_ended(1);
  v = w.view();
  EXPECT_EQ(v.running, 1u);
  EXPECT_EQ(v.waiting, 0u);
  EXPECT_EQ(w.ended_here(), 1u);
  EXPECT_EQ(w.ended(), 2u);
  t.ended_at_report = w.ended();
  w.set_telemetry(t);
  EXPECT_EQ(w.view().running, 2u);
  EXPECT_EQ(w.view().waiting, 1u);
}

// The prefill queue kv_cost reads: its total and oldest estimate, and the time since the worker's last first
// token, which restarts with every first token. A request that ends without one (cancelled, failed) leaves
// the queue without restarting that clock.
TEST(Worker, PrefillQueueReportsItsOldestEntryAndTheTimeSinceTheLastFirstToken) {
  Worker w(0, *parse_worker_url("http://a:1"));
  EXPECT_EQ(w.view().oldest_prefill_s, 0.0);
  EXPECT_EQ(w.view().prefill_elapsed_s, 0.0);
  const auto a = w.begin(90'000, 6.0);
  const auto b = w.begin(2'000, 0.1);
  const auto c = w.begin(4'000, 0.2);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  auto v = w.view();
  EXPECT_NEAR(v.pending_prefill_s, 6.3, 1e-9);
  EXPECT_DOUBLE_EQ(v.oldest_prefill_s, 6.0);
  const double before = v.prefill_elapsed_s;
  EXPECT_GE(before, 0.2);
  w.first_token(a, 90'000, 90'100);
  v = w.view();
  EXPECT_DOUBLE_EQ(v.oldest_prefill_s, 0.1);
  EXPECT_LT(v.prefill_elapsed_s, before);  // restarted
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  w.end(b, false, 2'000, 2'000);  // cancelled while queued
  v = w.view();
  EXPECT_NEAR(v.pending_prefill_s, 0.2, 1e-9);
  EXPECT_DOUBLE_EQ(v.oldest_prefill_s, 0.2);
  EXPECT_GE(v.prefill_elapsed_s, 0.2);  // not restarted
  w.first_token(c, 4'000, 4'100);
  v = w.view();
  EXPECT_EQ(v.pending_prefill_s, 0.0);
  EXPECT_EQ(v.oldest_prefill_s, 0.0);
  EXPECT_EQ(v.prefill_elapsed_s, 0.0);
  w.end(a, true, 90'000, 90'100);
  w.end(c, true, 4'000, 4'100);
  EXPECT_EQ(w.view().in_flight, 0u);
}


// The ids of a /v1/models answer, served names and adapters alike; anything else gives none.
TEST(ModelIds, ReadFromAModelsAnswer) {
  EXPECT_EQ(parse_model_ids(R"({"object":"list","data":[{"id":"qwen3-8b","object":"model"},)"
                            R"({"id":"sql-lora","object":"model","parent":"qwen3-8b"}]})"),
            (std::vector<std::string>{"qwen3-8b", "sql-lora"}));
  EXPECT_TRUE(parse_model_ids(R"({"data":[]})").empty());
  EXPECT_TRUE(parse_model_ids(R"({"data":[{"name":"x"},7,{"id":""}]})").empty());
  EXPECT_TRUE(parse_model_ids("not json").empty());
  EXPECT_TRUE(parse_model_ids(R"(["qwen3-8b"])").empty());
}

// A worker serves any model until its models are known, then only those.
TEST(Worker, ServesItsModelsOnceKnown) {
  Worker w(0, *parse_worker_url("http://127.0.0.1:8000"));
  EXPECT_TRUE(w.serves("anything"));
  w.set_models({"qwen3-8b", "sql-lora"});
  EXPECT_TRUE(w.serves("qwen3-8b"));
  EXPECT_TRUE(w.serves("sql-lora"));
  EXPECT_FALSE(w.serves("llama-3.1-8b"));
  EXPECT_FALSE(w.serves(""));
}

// The models version changes with the list, and only then (readers regroup workers on it).
TEST(Worker, ModelsVersionChangesWithTheList) {
  Worker w(0, *parse_worker_url("http://127.0.0.1:8000"));
  const auto v0 = w.models_version();
  w.set_models({"qwen3-8b"});
  const auto v1 = w.models_version();
  EXPECT_NE(v1, v0);
  w.set_models({"qwen3-8b"});
  EXPECT_EQ(w.models_version(), v1);
  w.set_models({"qwen3-8b", "sql-lora"});
  EXPECT_NE(w.models_version(), v1);
}

}  // namespace
}  // namespace kvroute::backends
