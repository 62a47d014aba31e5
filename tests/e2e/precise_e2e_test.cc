// Precise mode end to end: kvroute subscribed to the KV events of real kvroute-sim workers.
#include <algorithm>
#include <random>
#include <set>
#include <mutex>
#include <thread>

#include <boost/json.hpp>
#include <gtest/gtest.h>

#include "tests/support/harness.h"

namespace kvroute::test {
namespace {

namespace json = boost::json;
using namespace std::chrono_literals;

std::set<std::string> strings(const json::value& v, std::initializer_list<const char*> keys) {
  std::set<std::string> out;
  for (const char* k : keys) {
    for (const auto& h : v.at(k).as_array()) out.insert(std::string(h.as_string()));
  }
  return out;
}

struct Truth {
  double recall = 0;      // share of reported cached tokens the router predicted
  double false_rate = 0;  // share of predicted cached tokens that were not cached
  double hit_rate = 0;
};

// Three workers with small KV pools (so the burst evicts), kvroute in front, with or without KV events.
class PreciseFleet {
 public:
  // `format` is kvroute-sim's --kv-events-format (vllm or native); router_args are appended to kvroute's,
  // sim_args to kvroute-sim's.
  explicit PreciseFleet(bool events, const std::string& format = "vllm", std::vector<std::string> router_args = {},
                        std::vector<std::string> sim_args = {}) {
    sim_ = free_ports(3);
    ev_ = free_ports(3);
    replay_ = free_ports(3);
    std::vector<std::string> sim_argv{bin("kvroute-sim"), "--port", std::to_string(sim_), "--workers", "3", "--speed", "20",
                                      "--num-gpu-blocks", "200", "--kv-events-port", std::to_string(ev_),
                                      "--kv-events-replay-port", std::to_string(replay_), "--kv-events-format", format};
    sim_argv.insert(sim_argv.end(), sim_args.begin(), sim_args.end());
    sim_proc_ = Process::start(sim_argv, testing::TempDir() + "/kvroute-precise-sim.log");
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(wait_http(sim_ + i, "/health", 10s));
    api_ = free_port();
    admin_ = free_port();
    std::vector<std::string> argv{bin("kvroute"), "--listen", "127.0.0.1:" + std::to_string(api_), "--admin-listen",
                                  "127.0.0.1:" + std::to_string(admin_), "--metrics-interval", "0.2"};
    for (int i = 0; i < 3; ++i) {
      std::string w = "http://127.0.0.1:" + std::to_string(sim_ + i);
      if (events) {
        w += ",kv_events=tcp://127.0.0.1:" + std::to_string(ev_ + i) +
             ",replay=tcp://127.0.0.1:" + std::to_string(replay_ + i);
      }
      argv.push_back("--worker");
      argv.push_back(w);
    }
    argv.insert(argv.end(), router_args.begin(), router_args.end());
    router_ = Process::start(argv, testing::TempDir() + "/kvroute-precise-router.log");
    EXPECT_TRUE(wait_http(api_, "/health", 10s));
  }

  // A burst of requests over 24 shared prefixes (448 tokens each) with distinct tails: far more blocks than
  // three 200-block pools hold, so the workers evict.
  void burst(int requests) {
    std::mt19937_64 rng(42);
    for (int i = 0; i < requests; ++i) {
      const int prefix = static_cast<int>(rng() % 24);
      json::array prompt;
      std::mt19937_64 prng(1000 + prefix);
      for (int t = 0; t < 448; ++t) prompt.push_back(static_cast<std::int64_t>(1000 + prng() % 50000));
      const int tail = 16 + static_cast<int>(rng() % 64);
      for (int t = 0; t < tail; ++t) prompt.push_back(static_cast<std::int64_t>(60000 + rng() % 1000));
      json::object body{{"model", "qwen3-8b"}, {"prompt", prompt}, {"max_tokens", 4}};
      auto r = http(api_, "POST", "/v1/completions", json::serialize(body));
      ASSERT_EQ(r.status, 200) << r.body << r.error;
    }
  }

  // Waits until every worker's event stream is live.
  void wait_live() const {
    for (int i = 0; i < 3; ++i) {
      bool live = false;
      for (int k = 0; k < 100 && !live; ++k) {
        auto w = json::parse(http(admin_, "GET", "/admin/workers/" + std::to_string(i) + "/blocks").body);
        live = w.at("mode").as_string() == "precise";
        if (!live) std::this_thread::sleep_for(50ms);
      }
      ASSERT_TRUE(live) << "worker " << i;
    }
  }

  // Worker i's blocks: as it reports holding them, and as the router's index has them.
  struct Blocks {
    json::value truth, view;
  };
  Blocks blocks(int i) const {
    return {json::parse(http(sim_ + i, "GET", "/debug/kv_blocks").body),
            json::parse(http(admin_, "GET", "/admin/workers/127.0.0.1:" + std::to_string(sim_ + i) + "/blocks").body)};
  }

  // Whether the router's entries for every worker equal the blocks the worker reports holding.
  bool index_equals_workers() const {
    for (int i = 0; i < 3; ++i) {
      const Blocks b = blocks(i);
      if (strings(b.view, {"gpu", "cpu", "predicted"}) != strings(b.truth, {"gpu", "cpu"})) return false;
    }
    return true;
  }

  // Waits (up to `limit`) for the last KV events to reach the router: until its index equals what the workers
  // hold. A fixed sleep is too short on a loaded machine (sanitizer builds, parallel tests).
  void wait_for_events(std::chrono::milliseconds limit = 5s) const {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (!index_equals_workers() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(50ms);
  }

  // Checks that the router's entries for every worker equal the blocks the worker reports holding; returns
  // how many GPU blocks the workers hold in all.
  std::size_t expect_index_equals_workers() const {
    std::size_t total = 0;
    for (int i = 0; i < 3; ++i) {
      const Blocks b = blocks(i);
      EXPECT_EQ(b.view.at("mode").as_string(), "precise") << "worker " << i;
      EXPECT_EQ(strings(b.view, {"gpu", "cpu", "predicted"}), strings(b.truth, {"gpu", "cpu"})) << "worker " << i;
      total += strings(b.truth, {"gpu"}).size();
    }
    return total;
  }

  Truth truth() const {
    const std::string m = http(admin_, "GET", "/metrics").body;
    const double predicted = metric_sum(m, "kvroute_predicted_cached_tokens_total");
    const double reported = metric_sum(m, "kvroute_reported_cached_tokens_total");
    const double confirmed = metric_sum(m, "kvroute_confirmed_cached_tokens_total");
    const double prompt = metric_sum(m, "kvroute_prompt_tokens_total");
    return Truth{reported > 0 ? confirmed / reported : 1.0, predicted > 0 ? 1.0 - confirmed / predicted : 0.0,
                 prompt > 0 ? reported / prompt : 0.0};
  }

  int api() const { return api_; }
  int sim(int i) const { return sim_ + i; }
  int events(int i) const { return ev_ + i; }
  int replay(int i) const { return replay_ + i; }
  int admin() const { return admin_; }

 private:
  int sim_ = 0, ev_ = 0, replay_ = 0, api_ = 0, admin_ = 0;
  Process sim_proc_, router_;
};

// kv_cost's prefix hold (router/router.h, Router::prefix_held). Two requests share a 12K-token prefix that no
// worker holds; the second is sent while the first is computing its first 8K-token chunk (about 0.3 s
// simulated; the workers run at twice real time). The second would be admitted with the first one's second
// chunk.
constexpr std::uint64_t kHoldPrefix = 12288;

// `n` token ids drawn from `rng`: the prefix the prefix-hold tests' requests share.
json::array random_prefix(std::mt19937_64& rng, std::uint64_t n) {
  json::array prefix;
  for (std::uint64_t t = 0; t < n; ++t) prefix.push_back(static_cast<std::int64_t>(1000 + rng() % 50000));
  return prefix;
}

// A completion of 4 tokens for `prefix` and 32 token ids of its own (`tail` tells requests apart); streamed, with
// the usage in its last event.
std::string hold_request(const json::array& prefix, int tail, bool stream) {
  json::array prompt = prefix;
  for (int t = 0; t < 32; ++t) prompt.push_back(static_cast<std::int64_t>(60000 + tail * 100 + t));
  json::object b{{"model", "qwen3-8b"}, {"prompt", prompt}, {"max_tokens", 4}, {"stream", stream}};
  if (stream) b["stream_options"] = json::object{{"include_usage", true}};
  return json::serialize(b);
}

// Polls the router's /admin/workers every `poll` until some worker has a request in flight (at most 5 s).
void wait_until_routed(int admin, std::chrono::milliseconds poll) {
  const auto by = std::chrono::steady_clock::now() + 5s;
  auto routed = [&] {
    const auto workers = json::parse(http(admin, "GET", "/admin/workers").body);
    for (const auto& w : workers.at("workers").as_array())
      if (w.at("in_flight").to_number<int>() > 0) return true;
    return false;
  };
  while (!routed() && std::chrono::steady_clock::now() < by) std::this_thread::sleep_for(poll);
}

// Cordons the fleet's second and third workers through the admin API: every request goes to the first.
void cordon_all_but_the_first(PreciseFleet& fleet) {
  for (int i = 1; i < 3; ++i) {
    const auto c = http(fleet.admin(), "POST", "/admin/workers/127.0.0.1:" + std::to_string(fleet.sim(i)) + "/cordon");
    EXPECT_EQ(c.status, 200) << c.body;
  }
}

struct HoldRun {
  std::uint64_t first_cached = 0, second_cached = 0;
  std::string first_worker, second_worker;
  double first_ttft_s = 0;
  double second_sent_s = 0;  // after the first
  double holds = 0, hold_seconds = 0;
  std::set<std::string> commits;  // the workers' prefix_commit in /admin/workers after the teaching requests
  // With `leave`: what the workers saw (prompt tokens, completed and cancelled requests) and the router's count
  // of clients that left, once the first request is done.
  double worker_prompt_tokens = 0, worker_completed = 0, worker_cancelled = 0, clients_left = 0, in_flight = -1;
};

// With `teach`, streamed prompts of 4K token ids of their own are sent first, three at a time, until every
// worker has served one: their first tokens teach the router when each worker makes blocks hits. With `leave`,
// the client of the second request disconnects 30 ms after sending it.
HoldRun prefix_hold_run(std::vector<std::string> router_args, std::vector<std::string> sim_args, bool teach = false,
                        bool leave = false) {
  sim_args.insert(sim_args.end(), {"--speed", "2", "--num-gpu-blocks", "4000"});
  PreciseFleet fleet(/*events=*/true, "vllm", std::move(router_args), std::move(sim_args));
  fleet.wait_live();
  std::mt19937_64 rng(7);
  const json::array prefix = random_prefix(rng, kHoldPrefix);
  auto body = [&](int tail, bool stream) { return hold_request(prefix, tail, stream); };
  auto cached = [](const std::string& text) -> std::uint64_t {
    // The usage object of a response, or of a stream's last data event.
    const auto at = text.rfind("\"prompt_tokens_details\"");
    if (at == std::string::npos) return 0;
    const auto c = text.find("\"cached_tokens\":", at);
    return c == std::string::npos ? 0 : std::stoull(text.substr(c + 16));
  };
  HoldRun run;
  std::set<std::string> taught;
  for (int round = 0; teach && taught.size() < 3 && round < 10; ++round) {
    std::vector<std::thread> teachers;
    std::mutex mu;
    for (int k = 0; k < 3; ++k) {
      teachers.emplace_back([&, k] {
        json::array prompt;
        for (int t = 0; t < 4096; ++t) prompt.push_back(static_cast<std::int64_t>(70000 + 20000 * round + 5000 * k + t));
        json::object b{{"model", "qwen3-8b"}, {"prompt", prompt}, {"max_tokens", 2}, {"stream", true}};
        const auto r = http_stream(fleet.api(), "POST", "/v1/completions", json::serialize(b), {},
                                   [](const std::string&, std::chrono::steady_clock::time_point) {});
        EXPECT_EQ(r.status, 200) << r.error;
        std::lock_guard lock(mu);
        taught.insert(r.header("x-kvroute-worker"));
      });
    }
    for (auto& t : teachers) t.join();
  }
  if (teach) {
    EXPECT_EQ(taught.size(), 3u);
    const auto workers = json::parse(http(fleet.admin(), "GET", "/admin/workers").body);
    for (const auto& w : workers.at("workers").as_array()) run.commits.insert(std::string(w.at("prefix_commit").as_string()));
  }
  // Both requests go to one worker, the others cordoned: on an idle fleet whose caches hold nothing reused,
  // kv_cost may as well send the second to an idle worker to compute the prefix there (about the same TTFT,
  // and a copy costs nothing while a worker is idle and its cache holds nothing hit again), and what is tested
  // here is the hold on the worker computing it.
  cordon_all_but_the_first(fleet);
  std::string first_text;
  HttpResponse first;
  const auto sent = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point first_piece{};
  std::thread leader([&] {
    first = http_stream(fleet.api(), "POST", "/v1/completions", body(1, true), {},
                        [&](const std::string& piece, std::chrono::steady_clock::time_point at) {
                          if (first_piece == std::chrono::steady_clock::time_point{} && piece.find("data:") != std::string::npos)
                            first_piece = at;
                          first_text += piece;
                        });
  });
  // The second goes once the router has sent the first (it is then computing its first chunk, about 0.15 s).
  wait_until_routed(fleet.admin(), 2ms);
  std::this_thread::sleep_for(10ms);
  run.second_sent_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count();
  HttpResponse second;
  if (leave) {
    const std::string b = body(2, false);
    raw_exchange(fleet.api(), "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 "Content-Length: " + std::to_string(b.size()) + "\r\n\r\n" + b, 30ms);
  } else {
    second = http(fleet.api(), "POST", "/v1/completions", body(2, false));
  }
  leader.join();
  if (leave) {
    EXPECT_EQ(first.status, 200) << first.error;
    std::this_thread::sleep_for(200ms);  // the first request's end reaches the router
    for (int i = 0; i < 3; ++i) {
      const std::string wm = http(fleet.sim(i), "GET", "/metrics").body;
      run.worker_prompt_tokens += metric_sum(wm, "vllm:prompt_tokens_total");
      run.worker_completed += metric_sum(wm, "vllm:request_success_total");
      run.worker_cancelled += metric_sum(wm, "kvroute_sim:requests_cancelled_total");
    }
    const std::string m = http(fleet.admin(), "GET", "/metrics").body;
    run.clients_left = metric_sum(m, "kvroute_errors_total{kind=\"client_disconnected\"}");
    run.holds = metric_sum(m, "kvroute_prefix_holds_total");
    run.in_flight = 0;
    const auto workers = json::parse(http(fleet.admin(), "GET", "/admin/workers").body);
    for (const auto& w : workers.at("workers").as_array()) run.in_flight += w.at("in_flight").to_number<double>();
    return run;
  }
  EXPECT_EQ(first.status, 200) << first.error;
  EXPECT_EQ(second.status, 200) << second.body << second.error;
  run.first_cached = cached(first_text);
  run.second_cached = cached(second.body);
  run.first_worker = first.header("x-kvroute-worker");
  run.second_worker = second.header("x-kvroute-worker");
  run.first_ttft_s = std::chrono::duration<double>(first_piece - sent).count();
  const std::string m = http(fleet.admin(), "GET", "/metrics").body;
  run.holds = metric_sum(m, "kvroute_prefix_holds_total");
  run.hold_seconds = metric_sum(m, "kvroute_prefix_hold_seconds_total");
  std::printf("prefix hold: cached %llu then %llu tokens, workers %s / %s, first TTFT %.3f s, %g holds, %.3f s held\n",
              static_cast<unsigned long long>(run.first_cached), static_cast<unsigned long long>(run.second_cached),
              run.first_worker.c_str(), run.second_worker.c_str(), run.first_ttft_s, run.holds, run.hold_seconds);
  return run;
}

// On workers that make a step's blocks hits only once the step is done (kvroute-sim's default, as SGLang),
// the second request waits for the first one's prefix on the same worker and reads it all from cache; with
// the hold off, it is admitted while the prefix is still being computed, and computes again the chunks not
// done by then.
TEST(PreciseE2E, ARequestWaitsForThePrefixBeingComputedInsteadOfComputingItAgain) {
  const HoldRun held = prefix_hold_run({}, {});
  EXPECT_EQ(held.second_worker, held.first_worker);
  EXPECT_EQ(held.first_cached, 0u);
  EXPECT_EQ(held.second_cached, kHoldPrefix);  // the whole prefix
  EXPECT_EQ(held.holds, 1.0);
  // Until the first request's first token (which wakes the held request), within --prefix-hold.
  EXPECT_GT(held.second_sent_s + held.hold_seconds, held.first_ttft_s - 0.03);
  EXPECT_LT(held.hold_seconds, 0.4);

  const HoldRun not_held = prefix_hold_run({"--prefix-hold", "0"}, {});
  EXPECT_EQ(not_held.second_worker, not_held.first_worker);
  EXPECT_LT(not_held.second_cached, kHoldPrefix);  // chunks computed again
  EXPECT_EQ(not_held.holds, 0.0);
}

// On workers that make blocks hits when they schedule them (kvroute-sim --prefix-commit schedule, as vLLM v1),
// the worker's KV event says the prefix is stored as soon as the first request's second chunk is scheduled: the
// hold ends then, before that request's first token.
TEST(PreciseE2E, ThePrefixHoldEndsWithTheWorkersEventOnEnginesThatCommitBlocksWhenScheduled) {
  const HoldRun run = prefix_hold_run({}, {"--prefix-commit", "schedule"});
  EXPECT_EQ(run.second_worker, run.first_worker);
  EXPECT_EQ(run.second_cached, kHoldPrefix);
  EXPECT_EQ(run.holds, 1.0);
  EXPECT_LT(run.second_sent_s + run.hold_seconds, run.first_ttft_s - 0.02);

  // Once a worker's first tokens have shown it stores blocks when it schedules them, nothing is held there:
  // the second request is admitted with the first one's second chunk and reads the whole prefix all the same.
  const HoldRun taught = prefix_hold_run({}, {"--prefix-commit", "schedule"}, /*teach=*/true);
  EXPECT_EQ(taught.commits, (std::set<std::string>{"at_schedule"}));
  EXPECT_EQ(taught.second_worker, taught.first_worker);
  EXPECT_EQ(taught.second_cached, kHoldPrefix);
  EXPECT_EQ(taught.holds, 0.0);
}

// On workers that store blocks after the step, the teaching requests say so, and holds go on.
TEST(PreciseE2E, WorkersThatStoreBlocksAfterTheStepAreLearnedAndHoldsGoOn) {
  const HoldRun run = prefix_hold_run({}, {}, /*teach=*/true);
  EXPECT_EQ(run.commits, (std::set<std::string>{"after_step"}));
  EXPECT_EQ(run.second_cached, kHoldPrefix);
  EXPECT_EQ(run.holds, 1.0);
}

// A client that leaves while its request is held: the request is never sent, and the router counts the client
// as gone.
TEST(PreciseE2E, ARequestWhoseClientLeavesWhileHeldIsNeverSent) {
  const HoldRun run = prefix_hold_run({}, {}, /*teach=*/false, /*leave=*/true);
  EXPECT_EQ(run.holds, 1.0);
  EXPECT_EQ(run.clients_left, 1.0);
  EXPECT_EQ(run.worker_prompt_tokens, static_cast<double>(kHoldPrefix + 32));  // the first request's only
  EXPECT_EQ(run.worker_completed, 1.0);
  EXPECT_EQ(run.worker_cancelled, 0.0);
  EXPECT_EQ(run.in_flight, 0.0);
}

// A hold pays only while the prefix's prefill outlasts the worker's fixed part of TTFT (policy::prefix_hold_pays),
// which the router learns from requests with little to compute. Once it has, a request sharing a 256-token prefix
// with one still computing it is sent at once, while one sharing a 12K-token prefix is still held.
TEST(PreciseE2E, AShortPrefixIsNotWorthAHoldALongOneIs) {
  PreciseFleet fleet(/*events=*/true, "vllm", {}, {"--speed", "2", "--num-gpu-blocks", "4000"});
  fleet.wait_live();
  cordon_all_but_the_first(fleet);
  // Streamed requests of 8 tokens of their own teach the worker's fixed part of TTFT (front end, first step).
  for (int k = 0; k < 60; ++k) {
    json::array prompt;
    for (int t = 0; t < 8; ++t) prompt.push_back(static_cast<std::int64_t>(90000 + 10 * k + t));
    json::object b{{"model", "qwen3-8b"}, {"prompt", prompt}, {"max_tokens", 2}, {"stream", true}};
    const auto r = http_stream(fleet.api(), "POST", "/v1/completions", json::serialize(b), {},
                               [](const std::string&, std::chrono::steady_clock::time_point) {});
    ASSERT_EQ(r.status, 200) << r.error;
  }
  std::mt19937_64 rng(11);
  auto holds_for = [&](std::uint64_t prefix_tokens) {
    const json::array prefix = random_prefix(rng, prefix_tokens);
    auto body = [&](int tail, bool stream) { return hold_request(prefix, tail, stream); };
    const double before = metric_sum(http(fleet.admin(), "GET", "/metrics").body, "kvroute_prefix_holds_total");
    HttpResponse first;
    std::thread leader([&] {
      first = http_stream(fleet.api(), "POST", "/v1/completions", body(1, true), {},
                          [](const std::string&, std::chrono::steady_clock::time_point) {});
    });
    // The second goes once the router has sent the first, while the first computes its prefix.
    wait_until_routed(fleet.admin(), 1ms);
    const HttpResponse second = http(fleet.api(), "POST", "/v1/completions", body(2, false));
    leader.join();
    EXPECT_EQ(first.status, 200) << first.error;
    EXPECT_EQ(second.status, 200) << second.body << second.error;
    EXPECT_EQ(second.header("x-kvroute-worker"), first.header("x-kvroute-worker"));
    return metric_sum(http(fleet.admin(), "GET", "/metrics").body, "kvroute_prefix_holds_total") - before;
  };
  EXPECT_EQ(holds_for(256), 0.0);
  EXPECT_EQ(holds_for(kHoldPrefix), 1.0);
}

// A hold pays only while the request could be admitted together with the one computing its prefix
// (policy::prefix_hold_pays). Sent to an idle worker, that one starts at once, and a 6K-token prefix (one chunk) is
// computed in its first step: a request sharing it, sent meanwhile, goes at once and is admitted after that step,
// reading the whole prefix. Sent behind a 16K-token prompt, it waits to start, and a request sharing its prefix is
// held (sent at once, the two would be admitted in one step and both compute the prefix); so is a session's first
// turn.
TEST(PreciseE2E, ARequestIsHeldOnlyWhileThePrefixsComputationWaitsToStart) {
  PreciseFleet fleet(/*events=*/true, "vllm", {}, {"--speed", "2", "--num-gpu-blocks", "4000"});
  fleet.wait_live();
  cordon_all_but_the_first(fleet);
  constexpr std::uint64_t kPrefix = 6144;
  std::mt19937_64 rng(13);
  auto in_flight = [&] {
    int n = 0;
    const auto workers = json::parse(http(fleet.admin(), "GET", "/admin/workers").body);
    for (const auto& w : workers.at("workers").as_array()) n += w.at("in_flight").to_number<int>();
    return n;
  };
  auto wait_for_in_flight = [&](int n) {
    const auto by = std::chrono::steady_clock::now() + 5s;
    while (in_flight() < n && std::chrono::steady_clock::now() < by) std::this_thread::sleep_for(1ms);
  };
  auto stream = [&](const std::string& body) {
    return http_stream(fleet.api(), "POST", "/v1/completions", body, {},
                       [](const std::string&, std::chrono::steady_clock::time_point) {});
  };
  // Returns the holds and the cached tokens of the request sent while the first one computes the prefix.
  // `session`: the second request opens a session (a "user" it names): held as any request.
  auto run = [&](bool behind_a_long_prompt, const std::string& session = {}) {
    const json::array prefix = random_prefix(rng, kPrefix);
    const double before = metric_sum(http(fleet.admin(), "GET", "/metrics").body, "kvroute_prefix_holds_total");
    std::vector<std::thread> sent;
    if (behind_a_long_prompt) {
      sent.emplace_back([&, body = hold_request(random_prefix(rng, 16384), 9, true)] { EXPECT_EQ(stream(body).status, 200); });
      wait_for_in_flight(1);
    }
    sent.emplace_back([&, body = hold_request(prefix, 1, true)] { EXPECT_EQ(stream(body).status, 200); });
    wait_for_in_flight(behind_a_long_prompt ? 2 : 1);
    std::this_thread::sleep_for(10ms);
    json::value second_body = json::parse(hold_request(prefix, 2, false));
    if (!session.empty()) second_body.as_object()["user"] = session;
    const HttpResponse second = http(fleet.api(), "POST", "/v1/completions", json::serialize(second_body));
    for (auto& t : sent) t.join();
    EXPECT_EQ(second.status, 200) << second.body << second.error;
    const auto usage = json::parse(second.body).at("usage").at("prompt_tokens_details");
    const double holds = metric_sum(http(fleet.admin(), "GET", "/metrics").body, "kvroute_prefix_holds_total") - before;
    return std::make_pair(holds, usage.at("cached_tokens").to_number<std::uint64_t>());
  };
  const auto [holds_started, cached_started] = run(false);
  EXPECT_EQ(holds_started, 0.0);
  EXPECT_EQ(cached_started, kPrefix);  // admitted after the step that computed it
  const auto [holds_waiting, cached_waiting] = run(true);
  EXPECT_EQ(holds_waiting, 1.0);
  EXPECT_EQ(cached_waiting, kPrefix);
  const auto [holds_opening, cached_opening] = run(true, "session-1");
  EXPECT_EQ(holds_opening, 1.0);
  EXPECT_EQ(cached_opening, kPrefix);
}

TEST(PreciseE2E, RouterIndexEqualsWhatWorkersHoldAfterEvictingBurst) {
  PreciseFleet fleet(/*events=*/true);
  fleet.wait_live();
  fleet.burst(150);
  fleet.wait_for_events();
  EXPECT_GT(fleet.expect_index_equals_workers(), 300u);  // the pools were full: eviction happened
  const Truth t = fleet.truth();
  std::printf("precise mode: recall %.4f, false %.4f, hit rate %.3f\n", t.recall, t.false_rate, t.hit_rate);
  EXPECT_GE(t.recall, 0.98);
  EXPECT_LE(t.false_rate, 0.02);
}

// Text (chat) requests in precise mode are hashed over the workers' own token ids from /tokenize, so the
// router predicts exactly the cached tokens the worker reports, turn after turn.
TEST(PreciseE2E, ChatTextIsTokenizedByTheWorkersAndPredictedExactly) {
  PreciseFleet fleet(/*events=*/true);
  for (int k = 0; k < 100; ++k) {
    auto w = json::parse(http(fleet.admin(), "GET", "/admin/workers").body);
    bool all = true;
    for (const auto& x : w.at("workers").as_array()) all = all && x.at("mode").as_string() == "precise";
    if (all) break;
    std::this_thread::sleep_for(50ms);
  }
  json::array messages;
  messages.push_back(json::object{{"role", "system"}, {"content", std::string(600, 'x') + " answer briefly"}});
  for (int turn = 0; turn < 5; ++turn) {
    messages.push_back(json::object{{"role", "user"}, {"content", "question " + std::to_string(turn) + " about caches"}});
    json::object body{{"model", "qwen3-8b"}, {"messages", messages}, {"max_tokens", 8}};
    auto r = http(fleet.api(), "POST", "/v1/chat/completions", json::serialize(body));
    ASSERT_EQ(r.status, 200) << r.body;
    auto v = json::parse(r.body);
    messages.push_back(json::object{{"role", "assistant"},
                                    {"content", v.at("choices").at(0).at("message").at("content")}});
    fleet.wait_for_events();  // the turn's KV events reach the router before the next turn
  }
  const std::string m = http(fleet.admin(), "GET", "/metrics").body;
  EXPECT_GE(metric_sum(m, "kvroute_tokenize_total"), 5.0);
  const double reported = metric_sum(m, "kvroute_reported_cached_tokens_total");
  EXPECT_GT(reported, 500.0);
  EXPECT_EQ(metric_sum(m, "kvroute_predicted_cached_tokens_total"), reported);
  EXPECT_EQ(metric_sum(m, "kvroute_confirmed_cached_tokens_total"), reported);
}

// LoRA adapters have cache namespaces of their own (vLLM keys blocks by the LoRA; its KV events name it): the
// router predicts an adapter's hits from the adapter's blocks only, never from the base model's, in both event
// encodings.
TEST(PreciseE2E, LoraAdapterBlocksArePredictedInTheirOwnNamespace) {
  for (const std::string format : {"vllm", "native"}) {
    SCOPED_TRACE(format);
    PreciseFleet fleet(/*events=*/true, format, {"--policy", "round_robin"}, {"--lora-modules", "sql=/adapters/sql"});
    fleet.wait_live();
    json::array prompt;
    for (int t = 0; t < 320; ++t) prompt.push_back(1000 + (t * 7919) % 30000);
    auto send = [&](const std::string& model) {
      json::object body{{"model", model}, {"prompt", prompt}, {"max_tokens", 1}};
      auto r = http(fleet.api(), "POST", "/v1/completions", json::serialize(body), {{"x-session-id", "one-worker"}});
      EXPECT_EQ(r.status, 200) << r.body;
      fleet.wait_for_events();
      return json::parse(r.body).at("usage").at("prompt_tokens_details").at("cached_tokens").as_int64();
    };
    EXPECT_EQ(send("sql"), 0);
    EXPECT_GT(send("sql"), 200);        // the adapter's blocks, cached and predicted
    EXPECT_EQ(send("qwen3-8b"), 0);     // the same tokens for the base model: other blocks
    EXPECT_GT(send("qwen3-8b"), 200);
    const std::string m = http(fleet.admin(), "GET", "/metrics").body;
    const double reported = metric_sum(m, "kvroute_reported_cached_tokens_total");
    EXPECT_GT(reported, 400);
    EXPECT_EQ(metric_sum(m, "kvroute_predicted_cached_tokens_total"), reported);
    EXPECT_EQ(metric_sum(m, "kvroute_confirmed_cached_tokens_total"), reported);
  }
}

TEST(PreciseE2E, ApproximateModeTruthForComparison) {
  PreciseFleet fleet(/*events=*/false);
  fleet.burst(150);
  const Truth t = fleet.truth();
  std::printf("approximate mode: recall %.4f, false %.4f, hit rate %.3f\n", t.recall, t.false_rate, t.hit_rate);
  EXPECT_GT(t.hit_rate, 0.0);
}

// The same truth over kvroute's native protobuf stream (docs/events.md section 4): kvroute-sim publishes
// kvroute.v1.EventBatch payloads under the "kvroute.v1" topic, and the router, subscribed to every topic,
// picks the native decoder by that prefix. After an evicting burst its entries equal what every worker holds.
TEST(PreciseE2E, NativeEventStreamKeepsRouterIndexExactAfterEvictingBurst) {
  PreciseFleet fleet(/*events=*/true, "native", {"--metrics-interval", "0"});  // telemetry from load reports only
  fleet.wait_live();
  fleet.burst(150);
  fleet.wait_for_events();
  EXPECT_GT(fleet.expect_index_equals_workers(), 300u);  // the pools were full: eviction happened
  double evictions = 0;
  for (int i = 0; i < 3; ++i) {
    evictions += metric_sum(http(fleet.sim(i), "GET", "/metrics").body, "kvroute_sim:gpu_evictions_total");
  }
  EXPECT_GT(evictions, 0.0);
  // With /metrics polling off, the workers' telemetry came from the stream's LoadReports.
  const json::value workers = json::parse(http(fleet.admin(), "GET", "/admin/workers").body);
  for (const auto& w : workers.at("workers").as_array()) {
    ASSERT_TRUE(w.as_object().contains("num_gpu_blocks")) << json::serialize(w);
    EXPECT_EQ(w.at("num_gpu_blocks").to_number<int>(), 200);
    EXPECT_EQ(w.at("kv_events").at("malformed_frames").to_number<int>(), 0);
    EXPECT_EQ(w.at("kv_events").at("orphan_events").to_number<int>(), 0);
    EXPECT_GT(w.at("kv_events").at("events_applied").to_number<int>(), 0);
  }
}


// Workers added at run time through the admin API with their KV event publishers are in precise mode like
// workers given with --worker: after an evicting burst the router's entries equal what each worker holds.
TEST(PreciseE2E, WorkersAddedThroughTheAdminApiWithTheirEvents) {
  PreciseFleet fleet(/*events=*/false);
  for (int i = 0; i < 3; ++i) {
    const std::string name = "127.0.0.1:" + std::to_string(fleet.sim(i));
    ASSERT_EQ(http(fleet.admin(), "DELETE", "/admin/workers/" + name).status, 200);
    json::object w{{"url", "http://" + name},
                   {"kv_events", "tcp://127.0.0.1:" + std::to_string(fleet.events(i))},
                   {"kv_events_replay", "tcp://127.0.0.1:" + std::to_string(fleet.replay(i))}};
    auto added = http(fleet.admin(), "POST", "/admin/workers", json::serialize(w));
    ASSERT_EQ(added.status, 201) << added.body;
  }
  auto bad = http(fleet.admin(), "POST", "/admin/workers", R"({"url":"http://127.0.0.1:1","kv_event":"tcp://x:1"})");
  EXPECT_EQ(bad.status, 400);
  EXPECT_NE(bad.body.find("unknown worker attribute 'kv_event'"), std::string::npos) << bad.body;
  EXPECT_EQ(http(fleet.admin(), "POST", "/admin/workers", R"({"url":"http://127.0.0.1:1","dp_size":0})").status, 400);
  fleet.wait_live();
  fleet.burst(150);
  fleet.wait_for_events();
  EXPECT_GT(fleet.expect_index_equals_workers(), 300u);
  auto workers = json::parse(http(fleet.admin(), "GET", "/admin/workers").body).at("workers").as_array();
  ASSERT_EQ(workers.size(), 3u);
  for (const auto& w : workers) EXPECT_EQ(w.at("mode").as_string(), "precise");
}

}  // namespace
}  // namespace kvroute::test
