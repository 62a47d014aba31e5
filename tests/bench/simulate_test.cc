#include "bench/simulate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>

#include "bench/generators.h"
#include "bench/report.h"
#include "bench/runner.h"

namespace kvroute::bench {
namespace {

BenchConfig small_config(const std::string& workload, std::size_t requests, std::size_t workers = 4) {
  BenchConfig c;
  c.workload = workload;
  c.max_requests = requests;
  c.sim.workers = workers;
  c.policies = policy::policy_names();
  c.progress = false;
  return c;
}

// kv_cost alone over a hand-built workload on `workers` workers.
BenchConfig kv_cost_config(std::size_t workers) {
  BenchConfig c;
  c.sim.workers = workers;
  c.policies = {"kv_cost"};
  c.progress = false;
  return c;
}

// decision_us_* is the router's wall-clock decision time: the only field that is not a function of the seed.
std::string without_timing(const std::string& json) {
  return std::regex_replace(json, std::regex("\"decision_us_p(50|99)\":[^,}]*"), "\"decision_us\":0");
}

TEST(PlanRuns, NativeModesAndBoth) {
  auto runs = plan_runs({"round_robin", "cache_aware", "kv_cost"}, ModeChoice::kNative);
  ASSERT_TRUE(runs);
  ASSERT_EQ(runs->size(), 3u);
  EXPECT_EQ((*runs)[0].mode, IndexMode::kNone);
  EXPECT_EQ((*runs)[1].mode, IndexMode::kApproximate);
  EXPECT_EQ((*runs)[2].mode, IndexMode::kPrecise);
  EXPECT_EQ((*runs)[2].label, "kv_cost");
  auto both = plan_runs({"kv_cost"}, ModeChoice::kBoth);
  ASSERT_TRUE(both);
  ASSERT_EQ(both->size(), 2u);
  EXPECT_EQ((*both)[1].label, "kv_cost(approx)");
  EXPECT_FALSE(plan_runs({"nope"}, ModeChoice::kNative));
}

TEST(ParseArgs, Errors) {
  EXPECT_FALSE(parse_simulate_args({}));
  EXPECT_FALSE(parse_simulate_args({"--workload", "multi_turn", "--trace", "x"}));
  EXPECT_FALSE(parse_simulate_args({"--workload", "multi_turn", "--workers", "zero"}));
  EXPECT_FALSE(parse_simulate_args({"--workload", "multi_turn", "--policies", "round_robin,bogus"}));
  EXPECT_FALSE(parse_simulate_args({"--workload", "multi_turn", "--frobnicate", "1"}));
  auto ok = parse_simulate_args({"--workload", "multi_turn", "--workers", "3", "--sweep", "0.5,1,2", "--mode", "both"});
  ASSERT_TRUE(ok) << ok.error().message;
  EXPECT_EQ(ok->sim.workers, 3u);
  EXPECT_EQ(ok->sweep.size(), 3u);
  auto items = parse_simulate_args({"--workload", "multi_turn", "--policies", "round_robin,,kv_cost,"});
  ASSERT_TRUE(items) << items.error().message;  // empty items of a list are skipped
  EXPECT_EQ(items->policies, (std::vector<std::string>{"round_robin", "kv_cost"}));
  EXPECT_DOUBLE_EQ(items->sim.prefix_hold_s, 0.4);
  auto no_hold = parse_simulate_args({"--workload", "multi_turn", "--prefix-hold", "0"});
  ASSERT_TRUE(no_hold) << no_hold.error().message;
  EXPECT_DOUBLE_EQ(no_hold->sim.prefix_hold_s, 0);
  EXPECT_EQ(ok->sim.prefix_commit, sim::PrefixCommit::kStepEnd);
  auto commit = parse_simulate_args({"--workload", "multi_turn", "--prefix-commit", "schedule"});
  ASSERT_TRUE(commit) << commit.error().message;
  EXPECT_EQ(commit->sim.prefix_commit, sim::PrefixCommit::kSchedule);
  auto bad = parse_simulate_args({"--workload", "multi_turn", "--prefix-commit", "later"});
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("--prefix-commit"), std::string::npos) << bad.error().message;
}

TEST(Simulate, SameSeedSameJson) {
  BenchConfig c = small_config("multi_turn", 150, 3);
  c.policies = {"round_robin", "cache_aware", "kv_cost", "random"};
  c.mode = ModeChoice::kBoth;
  auto w = load_workload(c);
  ASSERT_TRUE(w);
  auto a = run_policies(*w, c, 2.0);
  c.threads = 1;  // thread count must not matter either
  auto b = run_policies(*w, c, 2.0);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(without_timing(to_json({*a})), without_timing(to_json({*b})));
  // And a fresh workload from the same seed.
  auto w2 = load_workload(c);
  auto d = run_policies(*w2, c, 2.0);
  ASSERT_TRUE(d);
  EXPECT_EQ(without_timing(to_json({*a})), without_timing(to_json({*d})));
}

TEST(Simulate, AllPoliciesSmoke) {
  BenchConfig c = small_config("tenants", 200);
  auto w = load_workload(c);
  ASSERT_TRUE(w);
  auto r = run_policies(*w, c, 1.0);
  ASSERT_TRUE(r) << r.error().message;
  ASSERT_EQ(r->policies.size(), policy::policy_names().size());
  EXPECT_GT(r->upper_bound_hit_rate, 0.3);
  EXPECT_LE(r->capacity_bound_hit_rate, r->upper_bound_hit_rate + 1e-12);
  for (const auto& p : r->policies) {
    EXPECT_EQ(p.completed, 200u) << p.name;
    EXPECT_GT(p.ttft.mean, 0) << p.name;
    EXPECT_LE(p.ttft.p50, p.ttft.p99) << p.name;
    EXPECT_GT(p.output_tok_s, 0) << p.name;
    EXPECT_GT(p.itl_mean_s, 0) << p.name;
    EXPECT_GE(p.itl_p99_s, p.itl_mean_s * 0.5) << p.name;
    EXPECT_GE(p.e2e_p99_s, p.e2e_mean_s) << p.name;
    EXPECT_GE(p.hit_rate, 0) << p.name;
    // Only kv_cost estimates latencies; its estimates are compared with every completed request.
    if (p.name == "kv_cost") {
      EXPECT_EQ(p.calibration.ttft_count, 200u);
      EXPECT_GT(p.calibration.itl_count, 0u);
      EXPECT_LE(p.calibration.ttft_median, p.calibration.ttft_p90);
    } else {
      EXPECT_EQ(p.calibration.ttft_count, 0u) << p.name;
    }
    EXPECT_LE(p.hit_rate, r->upper_bound_hit_rate + 1e-9) << p.name;
  }
  const std::string json = to_json({*r});
  for (const char* key : {"\"workload\"", "\"workers\"", "\"upper_bound_hit_rate\"", "\"capacity_bound_hit_rate\"",
                          "\"policies\"", "\"hit_rate\"", "\"ttft_mean_s\"", "\"ttft_p50_s\"", "\"ttft_p90_s\"",
                          "\"ttft_p99_s\"", "\"itl_mean_s\"", "\"itl_p99_s\"", "\"e2e_mean_s\"", "\"e2e_p99_s\"",
                          "\"calibration\"", "\"ttft_median_abs_err\"", "\"output_tok_s\"", "\"completed\"",
                          "\"load_cov\"", "\"evicted_blocks\"", "\"decision_us_p50\""})
    EXPECT_NE(json.find(key), std::string::npos) << key;
  EXPECT_NE(format_table(*r).find("kv_cost"), std::string::npos);
  EXPECT_NE(format_table(*r).find("calibration kv_cost"), std::string::npos);
  EXPECT_NE(format_table(*r).find("e2e_p99"), std::string::npos);
  const std::string svg = svg_line_chart("t", "x", "y", {{"a", {{0.1, 0.5}, {1.0, 1.0}}}}, true);
  EXPECT_NE(svg.find("<polyline"), std::string::npos);
}

TEST(RequestTally, TailsAndCalibration) {
  RequestTally t;
  // 100 requests: ITL 10 ms except one at 1 s, end-to-end 1..100 s; estimates 2x off for half of them.
  for (int i = 1; i <= 100; ++i) {
    const double itl = i == 100 ? 1.0 : 0.01;
    t.add(0.1, i, itl * 10, 11, 0, 100, 11, 0, i);
    t.add_estimate(0.1, i % 2 ? 0.1 : 0.05, itl, itl);
  }
  PolicyResult r;
  t.fill(r);
  EXPECT_NEAR(r.e2e_mean_s, 50.5, 1e-9);
  EXPECT_NEAR(r.e2e_p99_s, 99.01, 1e-9);
  EXPECT_GT(r.itl_p99_s, 0.01);
  EXPECT_NEAR(r.itl_mean_s, (99 * 0.1 + 10) / 1000, 1e-12);
  EXPECT_EQ(r.calibration.ttft_count, 100u);
  EXPECT_NEAR(r.calibration.ttft_median, 0.5, 1e-9);  // half exact, half at observed / estimated = 2
  EXPECT_NEAR(r.calibration.ttft_p90, 1.0, 1e-9);
  EXPECT_NEAR(r.calibration.itl_p90, 0.0, 1e-12);
}

TEST(Simulate, PrefixAwareBeatsRoundRobinOnSharedPrefixes) {
  BenchConfig c = small_config("shared_prefix", 400);
  c.policies = {"round_robin", "kv_cost", "cache_aware"};
  auto w = load_workload(c);
  ASSERT_TRUE(w);
  auto r = run_policies(*w, c, 1.0);
  ASSERT_TRUE(r);
  const double rr = r->policies[0].hit_rate;
  EXPECT_GT(r->policies[1].hit_rate, rr + 0.05);
  EXPECT_GT(r->policies[2].hit_rate, rr + 0.05);
}

// Committing blocks when a step is scheduled (vLLM v1) lets requests admitted into the same step as the one
// computing their prefix hit it: under load, every policy sees at least the hit rate of step-end commits, and
// round robin (which spreads a group's first requests over workers at once) strictly more.
TEST(Simulate, ScheduleTimeCommitsGiveSameStepFollowersTheirPrefix) {
  BenchConfig c = small_config("shared_prefix", 400);
  c.policies = {"round_robin", "kv_cost"};
  auto w = load_workload(c);
  ASSERT_TRUE(w);
  auto end = run_policies(*w, c, 2.0);
  c.sim.prefix_commit = sim::PrefixCommit::kSchedule;
  auto sched = run_policies(*w, c, 2.0);
  ASSERT_TRUE(end && sched);
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_GE(sched->policies[i].hit_rate, end->policies[i].hit_rate) << end->policies[i].name;
  }
  EXPECT_GT(sched->policies[0].hit_rate, end->policies[0].hit_rate);
}

// kv_cost's prefix hold, in the simulation as in the daemon: a request sent 50 ms after another with the same
// 12K-token prefix (two 8K-token chunks) would be admitted with the first one's second chunk and, on workers
// that store blocks after the step, compute those 4K tokens again; held until the first one's first token, it
// reads the whole prefix. Where blocks are hits from the step that schedules them, it reads it all anyway.
// A request of `prompt_tokens` over a token chain of 16-token blocks; the caller adds its block hashes.
Request token_request(double arrival_s, std::uint32_t prompt_tokens, std::uint32_t output_tokens) {
  Request r;
  r.arrival_s = arrival_s;
  r.prompt_tokens = prompt_tokens;
  r.output_tokens = output_tokens;
  r.chain.unit = hashing::Unit::kToken;
  r.chain.block_units = 16;
  r.chain.total_units = prompt_tokens;
  return r;
}

TEST(Simulate, PrefixHoldSavesRecomputingAPrefixBeingComputed) {
  Workload w;
  w.name = "two_requests";
  for (int k = 0; k < 2; ++k) {
    Request r = token_request(0.05 * k, 12288 + 32, 4);
    for (std::uint64_t b = 0; b < 768; ++b) r.chain.hashes.push_back(1000 + b);  // the shared prefix
    for (std::uint64_t b = 0; b < 2; ++b) r.chain.hashes.push_back(9000 + 10 * k + b);
    w.requests.push_back(std::move(r));
  }
  finalize(w);
  // One worker: on an idle fleet a second would compute the prefix at no cost to anyone.
  BenchConfig c = kv_cost_config(1);
  auto cached_share = [&](double hold, sim::PrefixCommit commit) {
    c.sim.prefix_hold_s = hold;
    c.sim.prefix_commit = commit;
    auto r = run_policies(w, c, 1.0);
    EXPECT_TRUE(r);
    return r ? r->policies[0].hit_rate : 0.0;
  };
  const double prompt = 2.0 * (12288 + 32);
  EXPECT_DOUBLE_EQ(cached_share(0.4, sim::PrefixCommit::kStepEnd), 12288 / prompt);
  EXPECT_DOUBLE_EQ(cached_share(0, sim::PrefixCommit::kStepEnd), 8192 / prompt);
  EXPECT_DOUBLE_EQ(cached_share(0, sim::PrefixCommit::kSchedule), 12288 / prompt);
  EXPECT_DOUBLE_EQ(cached_share(0.4, sim::PrefixCommit::kSchedule), 12288 / prompt);
}

// Router replicas sharing through Redis (with no delay) price each worker by the whole fleet's load, as one
// router does, so they keep its hit rate and TTFT on long shared prefixes (32-40K-token prompts, twelve
// prefixes over four workers). Each replica's view of a worker is built fresh for every request, as the daemon's
// Worker::view does: one whose own queue on a worker is empty must not price it with the prefill seconds
// left in an earlier request's view plus the others' load again (that cost 1.10x the mean TTFT here).
TEST(Simulate, SharingReplicasKeepOneRoutersHitRateOnLongPrefixes) {
  Workload w;
  w.name = "long_shared_prefixes";
  for (std::uint64_t k = 0; k < 240; ++k) {
    const std::uint64_t group = (k * 7) % 12, prefix_blocks = 2000 + 150 * (group % 4), tail_blocks = 40;
    Request r = token_request(0.1 * static_cast<double>(k),
                              static_cast<std::uint32_t>(16 * (prefix_blocks + tail_blocks)), 8);
    for (std::uint64_t b = 0; b < prefix_blocks; ++b) r.chain.hashes.push_back((group + 1) * 1'000'000 + b);
    for (std::uint64_t b = 0; b < tail_blocks; ++b) r.chain.hashes.push_back(900'000'000 + 100 * k + b);
    w.requests.push_back(std::move(r));
  }
  finalize(w);
  BenchConfig c = kv_cost_config(4);
  c.sim.sync_delay_s = 0;
  for (const ModeChoice mode : {ModeChoice::kApproximate, ModeChoice::kPrecise}) {
    c.mode = mode;
    c.sim.replicas = 1;
    c.sim.sharing = Sharing::kNone;
    auto one = run_policies(w, c, 1.0);
    c.sim.replicas = 8;
    c.sim.sharing = Sharing::kRedis;
    auto eight = run_policies(w, c, 1.0);
    ASSERT_TRUE(one && eight);
    const PolicyResult& a = one->policies[0];
    const PolicyResult& b = eight->policies[0];
    EXPECT_GT(a.hit_rate, 0.5);
    EXPECT_GE(b.hit_rate, 0.97 * a.hit_rate) << static_cast<int>(mode);
    EXPECT_LE(b.ttft.mean, 1.05 * a.ttft.mean) << static_cast<int>(mode);
  }
}

// Bursts that reach every replica at the same instant (a batch through a load balancer; the Mooncake
// conversation trace's whole-second arrivals): 16 cold 8K-token prompts at once, every second, over 8 replicas
// and 8 workers. Replicas that price the same view send their requests to the same cheapest worker; taking turns
// (policy::BurstStagger, one stream delay per rank) they route each burst as one router does. On this idle
// fleet every worker ties, and the tie rotation interleaved by rank (policy::replica_sequence) spreads the
// burst as well, with or without turns (with each replica's own count alone, the turns were what did: 0.488 s
// against 0.956 s without). Where costs differ, only the turns help: the conversation trace's first 3,000
// requests at 8 replicas, mean TTFT 0.99x one router's taking turns, 1.41x without (docs/benchmarks.md).
TEST(Simulate, SharingReplicasSpreadBurstsThatReachThemAtOnceAsOneRouter) {
  Workload w;
  w.name = "simultaneous_bursts";
  for (std::uint64_t k = 0; k < 16 * 60; ++k) {
    Request r = token_request(static_cast<double>(k / 16), 8192, 128);
    for (std::uint64_t b = 0; b < 512; ++b) r.chain.hashes.push_back(1'000'000 * (k + 1) + b);
    w.requests.push_back(std::move(r));
  }
  finalize(w);
  BenchConfig c = kv_cost_config(8);
  c.mode = ModeChoice::kApproximate;
  auto run = [&](std::size_t replicas, bool stagger) {
    c.sim.replicas = replicas;
    c.sim.sharing = replicas > 1 ? Sharing::kRedis : Sharing::kNone;
    c.sim.stagger = stagger;
    auto r = run_policies(w, c, 1.0);
    EXPECT_TRUE(r);
    return r ? r->policies[0] : PolicyResult{};
  };
  const PolicyResult one = run(1, true), turns = run(8, true), herd = run(8, false);
  std::printf("mean TTFT: one router %.3f s, 8 replicas taking turns %.3f s (%llu waited), without %.3f s\n",
              one.ttft.mean, turns.ttft.mean, static_cast<unsigned long long>(turns.staggered), herd.ttft.mean);
  EXPECT_EQ(one.staggered + herd.staggered, 0u);
  EXPECT_GT(turns.staggered, 0u);
  // Measured: 0.478 s, 0.481 s and 0.478 s.
  EXPECT_LE(turns.ttft.mean, 1.05 * one.ttft.mean);
  EXPECT_LE(herd.ttft.mean, 1.05 * one.ttft.mean);
}

// The debug dump: one CSV per policy run, a header and one line per completed request, with the session's bound
// worker for session workloads and the worker as the pick saw it (its KV pool's size among it).
TEST(Simulate, DumpRequestsWritesOneLinePerRequest) {
  BenchConfig c = small_config("multi_turn", 120, 3);
  c.policies = {"kv_cost"};
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "kvroute_dump_test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  c.sim.dump_dir = dir.string();
  auto w = load_workload(c);
  ASSERT_TRUE(w);
  auto r = run_policies(*w, c, 1.0);
  ASSERT_TRUE(r);
  std::ifstream in(dir / "kv_cost@1.csv");
  ASSERT_TRUE(in) << "no dump file";
  std::string header, line;
  std::getline(in, header);
  EXPECT_EQ(header, "id,arrival_s,prompt_tokens,output_tokens,worker,predicted_cached,cached,estimate_s,pending_tokens,"
                    "in_flight,ttft_s,e2e_s,best_matched,bound,reported_estimate_s,kv_usage,running,waiting,"
                    "inflight_kv_tokens,capacity_tokens");
  std::size_t lines = 0, bound = 0, sized = 0;
  while (std::getline(in, line)) {
    ++lines;
    std::vector<std::string> f;
    for (std::size_t at = 0, next; at <= line.size(); at = next + 1) {
      next = std::min(line.find(',', at), line.size());
      f.push_back(line.substr(at, next - at));
    }
    ASSERT_EQ(f.size(), 20u) << line;
    if (f[13] != "-1") ++bound;
    if (std::stoull(f[19]) > 0) ++sized;
  }
  EXPECT_EQ(lines, 120u);
  EXPECT_EQ(sized, 120u);
  EXPECT_GT(bound, 0u);  // later turns of a chat find their session bound
  std::filesystem::remove_all(dir);
}

TEST(Simulate, PreciseModeSeesEventsEvenWhenLate) {
  BenchConfig c = small_config("zipf_tools", 200);
  c.policies = {"kv_cost"};
  c.mode = ModeChoice::kBoth;
  c.sim.event_delay_s = 0.5;
  auto w = load_workload(c);
  ASSERT_TRUE(w);
  auto r = run_policies(*w, c, 1.0);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->policies.size(), 2u);
  for (const auto& p : r->policies) EXPECT_GT(p.hit_rate, 0.2) << p.name;
}

TEST(Simulate, KneeSearchFindsWhereRoundRobinSlowsDown) {
  BenchConfig c = small_config("tenants", 300, 2);
  auto w = load_workload(c);
  ASSERT_TRUE(w);
  auto k = find_knee(*w, c, 3.0);
  ASSERT_TRUE(k) << k.error().message;
  ASSERT_GT(k->scale, 0);
  ASSERT_GT(k->unloaded_ttft_s, 0);
  c.policies = {"round_robin"};
  auto at = run_policies(*w, c, k->scale);
  ASSERT_TRUE(at);
  EXPECT_GE(at->policies[0].ttft.mean, 3.0 * k->unloaded_ttft_s * 0.97);  // the scale is rounded to 3 digits
}

TEST(Report, PlotsForASweep) {
  BenchConfig c = small_config("zipf_tools", 100, 2);
  c.policies = {"round_robin", "kv_cost"};
  auto w = load_workload(c);
  ASSERT_TRUE(w);
  std::vector<RunReport> reports;
  for (double s : {0.5, 1.0}) {
    auto r = run_policies(*w, c, s);
    ASSERT_TRUE(r);
    reports.push_back(std::move(*r));
  }
  const std::string dir = ::testing::TempDir() + "/kvroute_bench_plots";
  auto files = write_plots(dir, reports);
  ASSERT_TRUE(files) << files.error().message;
  EXPECT_EQ(files->size(), 4u);  // two TTFT CDFs, hit rate and p99 TTFT against load
  const std::string json = to_json(reports);
  EXPECT_EQ(json.rfind("{\"sweep\":[", 0), 0u);
}

}  // namespace
}  // namespace kvroute::bench
