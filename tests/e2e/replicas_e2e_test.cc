// End-to-end tests of router replicas sharing state through Redis (--shared-state): a real redis-server on
// loopback, several kvroute processes in front of the same kvroute-sim workers, requests spread round-robin over
// the replicas, against one replica alone on the same workload.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include <boost/json.hpp>
#include <gtest/gtest.h>

// Built with AddressSanitizer or ThreadSanitizer (GCC's and clang's spellings).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define KVROUTE_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define KVROUTE_SANITIZED 1
#endif
#endif
#ifndef KVROUTE_SANITIZED
#define KVROUTE_SANITIZED 0
#endif

#include "tests/support/harness.h"
#include "tests/support/redis_server.h"

namespace kvroute::test {
namespace {

namespace json = boost::json;
using namespace std::chrono_literals;

constexpr int kWorkers = 4;
constexpr int kTenantBlocks = 400;
// The workers' prefill rate and decode step, as an operator configures the priors for their hardware. Qwen3-8B
// on an H100 in kvroute-sim prefills 2 x 8.2e9 FLOP per token at 989 TFLOP/s x 0.675, 40.7K tokens/s at short
// context, 26.5K at the reference context of policy/rate_learner.h (x 1 / (1 + 12,288 / 23,000)), and decodes
// a small batch in about 7 ms (16.4 GB of weights at 3.35 TB/s plus 2 ms of step overhead); the workers run at
// --speed 20: 530K tokens/s and 0.35 ms. With the defaults (20K, 20 ms) the learner, which moves at most 4x from
// a prior, stays 7x slow on both, and the prices of queueing and recomputing lose their proportions.
const char* kPrefillPrior = "530000";
const char* kDecodeStepPrior = "0.00035";
// A TCP proxy in front of `upstream` on loopback that passes what the server answers `delay` late (what the
// client sends goes through at once): a Redis that answers 5 ms late.
class DelayingProxy {
 public:
  DelayingProxy(int upstream, std::chrono::milliseconds delay) : upstream_(upstream), delay_(delay) {
    port_ = free_port();
    listen_ = listen_loopback(port_);
    if (listen_ < 0) port_ = -1;
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  ~DelayingProxy() {
    stop_ = true;
    ::shutdown(listen_, SHUT_RDWR);
    ::close(listen_);
    acceptor_.join();
    std::lock_guard lock(mu_);
    for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);
    for (auto& t : relays_) t.join();
    for (int fd : fds_) ::close(fd);
  }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }

 private:
  void accept_loop() {
    while (!stop_) {
      const int c = ::accept(listen_, nullptr, nullptr);
      if (c < 0) return;
      const int u = connect_loopback(upstream_);
      if (u < 0) {
        ::close(c);
        continue;
      }
      std::lock_guard lock(mu_);
      fds_.insert(fds_.end(), {c, u});
      relays_.emplace_back([this, c, u] { relay(c, u, std::chrono::milliseconds(0)); });
      relays_.emplace_back([this, c, u] { relay(u, c, delay_); });
    }
  }
  // Copies from `from` to `to`, each chunk `delay` after it was read.
  void relay(int from, int to, std::chrono::milliseconds delay) {
    char buf[65536];
    while (!stop_) {
      const ssize_t n = ::read(from, buf, sizeof buf);
      if (n <= 0) break;
      if (delay.count() > 0) std::this_thread::sleep_for(delay);
      for (ssize_t off = 0; off < n;) {
        const ssize_t w = ::write(to, buf + off, static_cast<std::size_t>(n - off));
        if (w <= 0) return;
        off += w;
      }
    }
    ::shutdown(to, SHUT_WR);
  }

  int upstream_, port_ = -1, listen_ = -1;
  std::chrono::milliseconds delay_;
  std::atomic<bool> stop_{false};
  std::thread acceptor_;
  std::mutex mu_;
  std::vector<int> fds_;
  std::vector<std::thread> relays_;
};

double metric(int port, const std::string& name) {
  const std::string m = http(port, "GET", "/metrics").body;
  double sum = 0;
  bool found = false;
  for (auto pos = m.find(name); pos != std::string::npos; pos = m.find(name, pos + 1)) {
    if (pos != 0 && m[pos - 1] != '\n') continue;
    const auto line = m.substr(pos, m.find('\n', pos) - pos);
    sum += std::stod(line.substr(line.rfind(' ') + 1));
    found = true;
  }
  return found ? sum : -1;
}

// 4 kvroute-sim workers (one process) and `replicas` kvroute processes sharing `redis` (none: a replica alone).
class Replicas {
 public:
  // `redis_url`, when given, is what the replicas connect to instead of redis->url() (a proxy in front of it).
  // `precise`: the workers publish KV events (with a replay socket) and every replica subscribes to them.
  // `router_args` are added to every replica's command line, `sim_args` to the workers' (later flags win).
  Replicas(int replicas, const Redis* redis, int gpu_blocks = 4096, std::string redis_url = "", bool precise = false,
           std::vector<std::string> router_args = {}, const std::vector<std::string>& sim_args = {})
      : redis_(redis), redis_url_(std::move(redis_url)), precise_(precise), router_args_(std::move(router_args)) {
    sim_ = free_ports(kWorkers);
    std::vector<std::string> sim_argv{bin("kvroute-sim"), "--port", std::to_string(sim_), "--workers",
                                      std::to_string(kWorkers), "--speed", "20", "--num-gpu-blocks",
                                      std::to_string(gpu_blocks)};
    sim_argv.insert(sim_argv.end(), sim_args.begin(), sim_args.end());
    if (precise_) {
      ev_ = free_ports(kWorkers);
      replay_ = free_ports(kWorkers);
      sim_argv.insert(sim_argv.end(), {"--kv-events-port", std::to_string(ev_), "--kv-events-replay-port",
                                       std::to_string(replay_)});
    }
    sim_proc_ = Process::start(sim_argv, testing::TempDir() + "/kvroute-replicas-sim.log");
    for (int i = 0; i < kWorkers; ++i) EXPECT_TRUE(wait_http(sim_ + i, "/health", 10s));
    for (int i = 0; i < replicas; ++i) add();
  }

  // Starts one more replica and waits until it answers /ready.
  int add() {
    const int i = static_cast<int>(api_.size());
    api_.push_back(free_port());
    admin_.push_back(free_port());
    procs_.emplace_back();
    start(i);
    return i;
  }
  void start(int i) {
    std::vector<std::string> argv{bin("kvroute"), "--listen", "127.0.0.1:" + std::to_string(api_[i]),
                                  "--admin-listen", "127.0.0.1:" + std::to_string(admin_[i]), "--threads", "1",
                                  "--health-interval", "0.2", "--healthy-threshold", "1",
                                  "--prefill-tokens-per-s", kPrefillPrior, "--decode-step-s", kDecodeStepPrior};
    // KVROUTE_TEST_ACCESS_LOG=1: each replica's access log (worker, reason, predicted and reported cached tokens
    // of every request) in its log file, to see which requests went where.
    if (std::getenv("KVROUTE_TEST_ACCESS_LOG")) argv.insert(argv.end(), {"--access-log", "true"});
    for (int w = 0; w < kWorkers; ++w) {
      std::string url = worker_url(w);
      if (precise_) {
        url += ",kv_events=tcp://127.0.0.1:" + std::to_string(ev_ + w) + ",replay=tcp://127.0.0.1:" +
               std::to_string(replay_ + w);
      }
      argv.insert(argv.end(), {"--worker", url});
    }
    if (redis_) {
      argv.insert(argv.end(), {"--shared-state", redis_url_.empty() ? redis_->url() : redis_url_,
                               "--shared-state-prefix", "e2e" + std::to_string(sim_)});
    }
    argv.insert(argv.end(), router_args_.begin(), router_args_.end());
    procs_[i] = Process::start(argv, log(i));
    EXPECT_TRUE(wait_http(api_[i], "/ready", 15s)) << "replica " << i;
  }
  void kill(int i) { procs_[i].kill_now(); }
  std::string log(int i) const { return testing::TempDir() + "/kvroute-replica-" + std::to_string(i) + ".log"; }
  std::string log_text(int i) const {
    std::ifstream f(log(i));
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
  std::string worker_url(int w) const { return "http://127.0.0.1:" + std::to_string(sim_ + w); }
  std::string worker_name(int w) const { return "127.0.0.1:" + std::to_string(sim_ + w); }
  int size() const { return static_cast<int>(api_.size()); }
  int api(int i) const { return api_[i]; }
  int admin(int i) const { return admin_[i]; }
  // The workers' mean TTFT (simulated seconds, from their own histograms: free of this machine's noise).
  double mean_ttft() const {
    double sum = 0, count = 0;
    for (int w = 0; w < kWorkers; ++w) {
      sum += metric(sim_ + w, "vllm:time_to_first_token_seconds_sum");
      count += metric(sim_ + w, "vllm:time_to_first_token_seconds_count");
    }
    return count > 0 ? sum / count : 0;
  }
  // GET /admin/workers of one replica: its "workers" (none if it does not answer).
  json::array workers(int replica) const {
    auto r = http(admin_[replica], "GET", "/admin/workers");
    if (r.status != 200) return {};
    return json::parse(r.body).at("workers").as_array();
  }
  bool cordoned_on(int replica, const std::string& worker) const {
    for (const auto& w : workers(replica)) {
      if (w.at("name").as_string() == worker) return w.at("cordoned").as_bool();
    }
    return false;
  }
  // /admin/status's "shared_state": {"up": ...}, as an operator reads it.
  bool status_says_up(int replica) const {
    auto r = http(admin_[replica], "GET", "/admin/status");
    if (r.status != 200) return false;
    return json::parse(r.body).at("shared_state").at("up").as_bool();
  }

 private:
  const Redis* redis_;
  std::string redis_url_;
  bool precise_ = false;
  std::vector<std::string> router_args_;
  int sim_ = 0, ev_ = 0, replay_ = 0;
  Process sim_proc_;
  std::vector<int> api_, admin_;
  std::vector<Process> procs_;
};

// Deterministic filler text: `words` words drawn from `seed`.
std::string text(std::uint64_t seed, int words) {
  static const char* kWords[] = {"alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
                                 "juliet", "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo"};
  std::string out;
  for (int i = 0; i < words; ++i) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    out += kWords[(seed >> 33) % 18];
    out += ' ';
  }
  return out;
}

struct Sent {
  int status = 0;
  std::string worker;
  double prompt = 0, cached = 0;
};

struct Result {
  int requests = 0, failed = 0;
  double prompt = 0, cached = 0;
  double hit_rate() const { return prompt > 0 ? cached / prompt : 0; }
  void add(const Sent& s) {
    ++requests;
    if (s.status != 200) ++failed;
    prompt += s.prompt;
    cached += s.cached;
  }
  void add(const Result& r) {
    requests += r.requests;
    failed += r.failed;
    prompt += r.prompt;
    cached += r.cached;
  }
};

// Requests [from, to) from `threads` clients, request i sent by send_one(i); their outcomes summed.
template <class SendOne>
Result run_each(int from, int to, int threads, SendOne send_one) {
  Result res;
  std::mutex mu;
  std::atomic<int> next{from};
  std::vector<std::thread> clients;
  for (int t = 0; t < threads; ++t) {
    clients.emplace_back([&] {
      for (int i = next++; i < to; i = next++) {
        const Sent s = send_one(i);
        std::lock_guard lock(mu);
        res.add(s);
      }
    });
  }
  for (auto& c : clients) c.join();
  return res;
}

Sent send(int port, const std::string& prompt, const std::map<std::string, std::string>& headers = {},
          int max_tokens = 4) {
  json::object body{{"model", "qwen3-8b"}, {"prompt", prompt}, {"max_tokens", max_tokens}};
  auto r = http(port, "POST", "/v1/completions", json::serialize(body), headers);
  Sent s;
  s.status = r.status;
  if (r.status != 200) return s;
  s.worker = r.header("x-kvroute-worker");
  auto v = json::parse(r.body);
  s.prompt = v.at("usage").at("prompt_tokens").to_number<double>();
  s.cached = v.at("usage").at("prompt_tokens_details").at("cached_tokens").to_number<double>();
  return s;
}

// `n` requests from `threads` clients, request i through replica i % replicas, built by make(i) as
// {prompt, session}.
template <class Make>
Result run(const Replicas& fleet, int n, int threads, Make make, int only_replica = -1) {
  return run_each(0, n, threads, [&](int i) {
    const auto [prompt, session] = make(i);
    const int replica = only_replica >= 0 ? only_replica : i % fleet.size();
    std::map<std::string, std::string> headers;
    if (!session.empty()) headers["x-session-id"] = session;
    return send(fleet.api(replica), prompt, headers);
  });
}

// Tenants: 32 long shared system prompts, each request one of them plus its own question.
std::pair<std::string, std::string> tenant_request(int i) {
  const int tenant = (i * 7 + i / 5) % 32;
  return {text(1000 + tenant, 300) + "question " + std::to_string(i) + ": " + text(i, 20), ""};
}

// Multi-turn sessions: 16 conversations of 6 turns, each turn its history plus a new message; turns of one
// conversation run in order (request i is turn i / 16 of conversation i % 16).
std::pair<std::string, std::string> session_request(int i) {
  const int conv = i % 16, turn = i / 16;
  std::string prompt = text(5000 + conv, 120);
  for (int t = 0; t <= turn; ++t) prompt += "turn " + std::to_string(t) + ": " + text(conv * 100 + t, 60);
  return {prompt, "conversation-" + std::to_string(conv)};
}

TEST(ReplicasE2E, ApproximateHitRateMatchesOneReplica) {
  if (!redis_available()) GTEST_SKIP() << "redis-server is not installed (scripts/setup.sh installs it)";
  struct Cell { Result tenants, sessions; double ttft_sessions = 0; };
  auto measure = [&](int replicas, const Redis* redis) {
    Cell c;
    {
      // KV capacity for the tenants' prompts once, not once per replica: a prompt each replica sends to a
      // worker of its own choosing evicts others.
      Replicas fleet(replicas, redis, kTenantBlocks);
      c.tenants = run(fleet, 320, 6, tenant_request);
    }
    {
      Replicas fleet(replicas, redis);
      // One turn of every conversation at a time: each round's 16 requests in parallel.
      for (int turn = 0; turn < 6; ++turn) {
        c.sessions.add(run(fleet, 16, 8, [turn](int i) { return session_request(turn * 16 + i); }));
      }
      c.ttft_sessions = fleet.mean_ttft();
    }
    return c;
  };
  const Cell one = measure(1, nullptr);
  Redis redis;
  const auto [calls0, bytes0] = redis.calls_and_bytes();
  const Cell three = measure(3, &redis);
  const auto [calls1, bytes1] = redis.calls_and_bytes();
  const double routed = three.tenants.requests + three.sessions.requests;
  // Everything Redis served during the runs (the replicas' idle reads and load included), per routed request.
  std::printf("redis: %.1f commands and %.0f bytes per routed request\n", (calls1 - calls0) / routed,
              (bytes1 - bytes0) / routed);
  // For reference, not asserted: the same replicas without sharing.
  const Cell alone = measure(3, nullptr);
  std::printf("3 replicas without sharing: tenants hit %.3f, sessions %.3f\n", alone.tenants.hit_rate(),
              alone.sessions.hit_rate());
  // The workload depends on what the replicas share (each replica's own copies of the tenants' prompts evict
  // one another); the sessions alone do not, as the fleet is idle between turns.
  EXPECT_LT(alone.tenants.hit_rate(), 0.8 * three.tenants.hit_rate());
  std::printf("tenants: 1 replica hit %.3f, 3 replicas %.3f (%.3fx)\n", one.tenants.hit_rate(), three.tenants.hit_rate(),
              three.tenants.hit_rate() / one.tenants.hit_rate());
  std::printf("sessions: 1 replica hit %.3f TTFT %.4f s, 3 replicas %.3f TTFT %.4f s (%.3fx, %.3fx)\n",
              one.sessions.hit_rate(), one.ttft_sessions, three.sessions.hit_rate(), three.ttft_sessions,
              three.sessions.hit_rate() / one.sessions.hit_rate(), three.ttft_sessions / one.ttft_sessions);
  EXPECT_EQ(three.tenants.failed + three.sessions.failed, 0);
  EXPECT_GE(three.tenants.hit_rate(), 0.97 * one.tenants.hit_rate());
  EXPECT_GE(three.sessions.hit_rate(), 0.97 * one.sessions.hit_rate());
  EXPECT_LE(three.ttft_sessions, 1.10 * one.ttft_sessions);
}

// Bursts that reach every replica at the same instant, as a client firing a batch through a load balancer makes
// them: 6 long cold prompts at once, 2 through each of 3 replicas, onto 4 idle workers. One router spreads a
// burst 2-2-1-1; replicas that each priced the same idle fleet, and rotated ties from the same place, sent their
// first requests to the same worker. Taking turns (policy/burst_stagger.h) they spread it as one router does;
// with their tie rotations interleaved by rank (policy::replica_sequence) they do even without turns, as the
// workers of an idle fleet tie (the turns still matter where costs differ: docs/benchmarks.md).
TEST(ReplicasE2E, BurstsReachingEveryReplicaAtOnceAreSpreadAsOneRouterSpreadsThem) {
  if (!redis_available()) GTEST_SKIP() << "redis-server is not installed (scripts/setup.sh installs it)";
  // The first bursts teach each replica that its arrivals come in bursts (BurstStagger learns it over about 64
  // of them); the last 40 are measured.
  constexpr int kBursts = 60, kMeasured = 40, kPerBurst = 6;
  struct Spread {
    double most = 0;  // mean over the measured bursts of the most requests one worker got
    int failed = 0;
    double staggered = 0;  // kvroute_staggered_requests_total over the replicas
    std::set<std::int64_t> ranks;  // /admin/status shared_state.rank of each replica
    double stream_delay_s = 0;     // the smallest shared_state.stream_delay_s
  };
  auto measure = [&](int replicas, const Redis* redis, const char* stagger) {
    Replicas fleet(replicas, redis, 4096, "", false, {"--shared-state-stagger", stagger});
    Spread out;
    for (int b = 0; b < kBursts; ++b) {
      std::vector<std::string> workers(kPerBurst);
      std::atomic<int> ready{0};
      std::vector<std::thread> clients;
      for (int j = 0; j < kPerBurst; ++j) {
        clients.emplace_back([&, j] {
          const std::string prompt = "burst " + std::to_string(b) + " request " + std::to_string(j) + ": " +
                                     text(static_cast<std::uint64_t>(b) * 100 + j, 4000);
          ++ready;
          while (ready.load() < kPerBurst) std::this_thread::yield();
          const Sent s = send(fleet.api(j % replicas), prompt);
          if (s.status != 200) ++out.failed;
          workers[j] = s.worker;
        });
      }
      for (auto& c : clients) c.join();
      std::map<std::string, int> per_worker;
      for (const auto& w : workers) ++per_worker[w];
      int most = 0;
      for (const auto& [w, n] : per_worker) most = std::max(most, n);
      if (b >= kBursts - kMeasured) out.most += static_cast<double>(most) / kMeasured;
      std::this_thread::sleep_for(60ms);  // the fleet idle again, and every replica's published load with it
    }
    out.stream_delay_s = 1e9;
    for (int i = 0; i < replicas; ++i) {
      out.staggered += metric_sum(http(fleet.admin(i), "GET", "/metrics").body, "kvroute_staggered_requests_total");
      if (!redis) continue;
      const json::value status = json::parse(http(fleet.admin(i), "GET", "/admin/status").body).at("shared_state");
      out.ranks.insert(status.at("rank").to_number<std::int64_t>());
      out.stream_delay_s = std::min(out.stream_delay_s, status.at("stream_delay_s").to_number<double>());
    }
    return out;
  };
  const Spread one = measure(1, nullptr, "on");
  Redis redis;
  const Spread turns = measure(3, &redis, "on");
  const Spread herd = measure(3, &redis, "off");
  std::printf("most requests of a burst on one worker: 1 replica %.2f, 3 replicas taking turns %.2f (%.0f of %d "
              "requests waited), without %.2f\n", one.most, turns.most, turns.staggered, kPerBurst * kBursts,
              herd.most);
  EXPECT_EQ(one.failed + turns.failed + herd.failed, 0);
  EXPECT_EQ(one.staggered + herd.staggered, 0);  // alone, or turned off: nothing waits
  // Each replica knows its turn: ranks 0, 1 and 2 (from the P:members heartbeat), and the stream's delay.
  EXPECT_EQ(turns.ranks, (std::set<std::int64_t>{0, 1, 2}));
  EXPECT_GT(turns.stream_delay_s, 0);
  EXPECT_LT(turns.stream_delay_s, 0.025);
  // Measured on two busy cores: taking turns 2.00 with 125 requests waiting, without 2.03, one router 2.00
  // (before the interleaved tie rotation: taking turns 2.00-2.37, without 2.47-2.85). A replica waits only for
  // arrivals within a stream delay (a millisecond or two) of each other; under a sanitizer every process runs
  // several times slower, a burst's two 25 KB bodies reach a replica further apart than that, and none waits (as
  // measured under ASan and TSan): there the spread is not judged.
#if KVROUTE_SANITIZED
  std::printf("sanitizer build: taking turns not judged (%.0f requests waited)\n", turns.staggered);
#else
  EXPECT_GT(turns.staggered, 0);
  EXPECT_LE(turns.most, one.most + 0.4);
#endif
  EXPECT_LE(herd.most, one.most + 0.4);  // ties interleaved: spread without turns too
}

TEST(ReplicasE2E, ConversationAlternatingReplicasStaysOnOneWorker) {
  if (!redis_available()) GTEST_SKIP() << "redis-server is not installed";
  Redis redis;
  // KVROUTE_TEST_NO_SHARING=1 runs the same replicas without Redis: then every turn after the first goes cold
  // on another worker (the test's own check that it depends on what the replicas share).
  const char* no_sharing = std::getenv("KVROUTE_TEST_NO_SHARING");
  Replicas fleet(3, no_sharing && *no_sharing ? nullptr : &redis, kTenantBlocks);
  // Other tenants' traffic meanwhile, so that each replica's own view of the workers' load differs.
  std::atomic<bool> stop{false};
  std::vector<std::thread> background;
  for (int t = 0; t < 3; ++t) {
    background.emplace_back([&, t] {
      for (int i = 0; !stop; ++i) send(fleet.api((t + i) % 3), tenant_request(t * 1000 + i).first);
    });
  }
  std::set<std::string> workers;
  double last_cached = -1;
  std::string prompt = text(77, 200);
  for (int turn = 0; turn < 6; ++turn) {
    prompt += "user turn " + std::to_string(turn) + ": " + text(900 + turn, 40);
    const Sent s = send(fleet.api(turn % 3), prompt, {{"x-session-id", "alternating"}});
    ASSERT_EQ(s.status, 200);
    workers.insert(s.worker);
    if (turn > 0) {
      EXPECT_GT(s.cached, last_cached) << "turn " << turn;
    }
    last_cached = s.cached;
    prompt += "assistant: " + text(1900 + turn, 10);
    std::this_thread::sleep_for(50ms);  // a user reading the answer; the binding reaches the other replicas
  }
  stop = true;
  for (auto& b : background) b.join();
  EXPECT_EQ(workers.size(), 1u);
}

// A worker's polled `running` counts a request that ended after the poll until the next one, and every replica
// polls on its own: each takes the requests that ended since it asked off the report, the others' too (P:ended).
// Each round, a long answer through replica 0 that replica 1's polls see running (once a second), then, a user's
// pause after it ends, a short request for the same prefix through replica 1: it stays on the prefix's holder.
// (Taking off only its own ends, replica 1 priced the finished request's decode there and moved the prefix.)
TEST(ReplicasE2E, ARequestAnotherReplicaSawEndDoesNotMoveItsPrefix) {
  if (!redis_available()) GTEST_SKIP() << "redis-server is not installed";
  Redis redis;
  Replicas fleet(2, &redis, 4096, "", false, {"--metrics-interval", "1"}, {"--speed", "1"});
  const std::string prefix = text(4242, 150);
  std::string holder;
  for (int round = 0; round < 3; ++round) {
    const auto start = std::chrono::steady_clock::now();
    const Sent long_answer = send(fleet.api(0), prefix + "long answer " + std::to_string(round), {}, 300);
    ASSERT_EQ(long_answer.status, 200);
    ASSERT_GT(std::chrono::steady_clock::now() - start, 1s) << "the answer must outlast a poll";
    if (holder.empty()) holder = long_answer.worker;
    EXPECT_EQ(long_answer.worker, holder) << "round " << round;
    std::this_thread::sleep_for(100ms);  // the end reaches replica 1 within two load exchanges (25 ms each)
    const Sent next = send(fleet.api(1), prefix + "short answer " + std::to_string(round));
    ASSERT_EQ(next.status, 200);
    EXPECT_EQ(next.worker, holder) << "round " << round;
    EXPECT_GT(next.cached, 100) << "round " << round;
  }
  // Each replica's admin API shows the holder's ends, its own and the other's (three each).
  for (int replica = 0; replica < 2; ++replica) {
    const auto until = std::chrono::steady_clock::now() + 2s;
    double here = -1, others = -1;
    while (std::chrono::steady_clock::now() < until && !(here == 3 && others == 3)) {
      for (const auto& w : fleet.workers(replica)) {
        if (w.at("name").as_string() != holder) continue;
        here = w.at("requests_ended").to_number<double>();
        others = w.at("requests_ended_other_replicas").to_number<double>();
      }
      std::this_thread::sleep_for(20ms);
    }
    EXPECT_EQ(here, 3) << "replica " << replica;
    EXPECT_EQ(others, 3) << "replica " << replica;
  }
}

// What a replica publishes of its load carries the KV tokens its requests in flight will hold (kv_cost's admission
// prices the wait for a pool's room by what they free as they end, policy::kv_room_shortfall): while a 300-token
// answer streams through replica 0, its load in Redis names the worker, one request in flight and its uncached
// prompt tokens plus 300.
TEST(ReplicasE2E, AReplicasPublishedLoadCarriesTheKvTokensOfItsRequestsInFlight) {
  if (!redis_available()) GTEST_SKIP() << "redis-server is not installed";
  Redis redis;
  Replicas fleet(2, &redis, 4096, "", false, {}, {"--speed", "1"});
  Sent answer;
  std::thread client([&] { answer = send(fleet.api(0), text(777, 150) + "tell a long story", {}, 300); });
  // The published load: "#\tSEQ" then per worker: URL, in flight, pending tokens, pending s, oldest s, decode
  // tokens, time without a first token, KV tokens in flight (backends/shared_state/wire.h).
  std::vector<std::string> line;
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (line.empty() && std::chrono::steady_clock::now() < until) {
    const std::string keys = redis.command("KEYS *:load:*");
    for (auto at = keys.find(":load:"); at != std::string::npos && line.empty(); at = keys.find(":load:", at + 1)) {
      const auto begin = keys.rfind('\n', at) + 1, end = keys.find('\r', at);
      const std::string value = redis.command("GET " + keys.substr(begin, end - begin));
      for (auto row = value.find("http://"); row != std::string::npos; row = value.find("http://", row + 1)) {
        std::vector<std::string> f;
        std::stringstream fields(value.substr(row, value.find('\n', row) - row));
        for (std::string x; std::getline(fields, x, '\t');) f.push_back(x);
        if (f.size() == 8 && f[1] == "1") line = f;
      }
    }
    std::this_thread::sleep_for(20ms);
  }
  client.join();
  ASSERT_EQ(answer.status, 200);
  ASSERT_EQ(line.size(), 8u) << "no published load with one request in flight";
  EXPECT_EQ(line[0], "http://" + answer.worker);
  // The output's 300 and the prompt's uncached tokens as the router counts them (its estimate of the worker's
  // tokenizer: here 237 against the worker's 210).
  const double prompt_tokens = std::stod(line[7]) - 300;
  EXPECT_GT(prompt_tokens, 0.7 * (answer.prompt - answer.cached)) << line[7];
  EXPECT_LT(prompt_tokens, 1.3 * (answer.prompt - answer.cached)) << line[7];
}

TEST(ReplicasE2E, CordonHoldsOnEveryReplicaAndAfterARestart) {
  if (!redis_available()) GTEST_SKIP() << "redis-server is not installed";
  Redis redis;
  Replicas fleet(3, &redis);
  const std::string name = fleet.worker_name(1);
  ASSERT_EQ(http(fleet.admin(0), "POST", "/admin/workers/" + name + "/cordon").status, 200);
  const auto t0 = std::chrono::steady_clock::now();
  bool everywhere = false;
  while (!everywhere && std::chrono::steady_clock::now() - t0 < 1s) {
    everywhere = fleet.cordoned_on(1, name) && fleet.cordoned_on(2, name);
    if (!everywhere) std::this_thread::sleep_for(10ms);
  }
  EXPECT_TRUE(everywhere) << "the cordon did not reach every replica within 1 s";
  for (int i = 0; i < 24; ++i) {
    const Sent s = send(fleet.api(i % 3), text(3000 + i, 80));
    ASSERT_EQ(s.status, 200);
    EXPECT_NE(s.worker, name);
  }
  fleet.kill(2);  // kill -9, then start again: it reads the admin state before it is ready
  fleet.start(2);
  EXPECT_TRUE(fleet.cordoned_on(2, name));
  for (int i = 0; i < 12; ++i) EXPECT_NE(send(fleet.api(2), text(4000 + i, 80)).worker, name);
  ASSERT_EQ(http(fleet.admin(2), "POST", "/admin/workers/" + name + "/uncordon").status, 200);
  std::this_thread::sleep_for(1s);
  EXPECT_FALSE(fleet.cordoned_on(0, name));
  EXPECT_FALSE(fleet.cordoned_on(1, name));
}

TEST(ReplicasE2E, RedisKilledMidRunFailsNoRequest) {
  if (!redis_available()) GTEST_SKIP() << "redis-server is not installed";
  Redis redis;
  Replicas fleet(3, &redis);
  std::atomic<bool> stop{false};
  std::atomic<int> sent{0}, failed{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < 3; ++t) {
    clients.emplace_back([&, t] {
      for (int i = 0; !stop; ++i) {
        const auto [prompt, session] = tenant_request(t * 100000 + i);
        if (send(fleet.api((t + i) % 3), prompt).status != 200) ++failed;
        ++sent;
      }
    });
  }
  std::this_thread::sleep_for(1s);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(metric(fleet.admin(i), "kvroute_shared_state_up"), 1) << i;
  redis.kill();
  std::this_thread::sleep_for(1500ms);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(metric(fleet.admin(i), "kvroute_shared_state_up"), 0) << i;
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(fleet.status_says_up(i)) << i;
  redis.start();
  const auto back = std::chrono::steady_clock::now();
  bool up = false;
  while (!up && std::chrono::steady_clock::now() - back < 5s) {
    up = true;
    for (int i = 0; i < 3; ++i) up = up && metric(fleet.admin(i), "kvroute_shared_state_up") == 1;
    if (!up) std::this_thread::sleep_for(50ms);
  }
  std::printf("sharing back %.2f s after redis returned\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - back).count());
  EXPECT_TRUE(up) << "sharing did not come back within 5 s of Redis's return";
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(fleet.status_says_up(i)) << i;
  std::this_thread::sleep_for(500ms);
  stop = true;
  for (auto& c : clients) c.join();
  EXPECT_GT(sent.load(), 30);
  EXPECT_EQ(failed.load(), 0);
  for (int i = 0; i < 3; ++i) {
    const std::string log = fleet.log_text(i);
    EXPECT_NE(log.find("is down"), std::string::npos) << "replica " << i;
    EXPECT_NE(log.find("is up: sharing"), std::string::npos) << "replica " << i;
  }
}

// Redis answering 5 ms late (a proxy in front of it) changes nothing a client sees: nothing on the request path
// waits for it. The same requests go alternately to two fleets of 3 replicas, one sharing through Redis
// directly, one through the slow proxy, so that both see the same machine. Also measured for the operations
// guide: Redis's CPU per 1,000 routed requests/s.
TEST(ReplicasE2E, RedisAnsweringLateDoesNotSlowClients) {
  if (!redis_available()) GTEST_SKIP() << "redis-server is not installed";
  Redis redis;
  DelayingProxy slow(redis.port(), 5ms);
  Replicas direct(3, &redis, kTenantBlocks);
  Replicas late(3, &redis, kTenantBlocks, slow.url());
  std::vector<double> fast_s, slow_s;
  const double cpu0 = redis.cpu_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  std::mutex mu;
  std::atomic<int> next{0}, failed{0};
  std::vector<std::thread> clients;
  constexpr int kRequests = 600;
  for (int c = 0; c < 4; ++c) {
    clients.emplace_back([&] {
      for (int i = next++; i < kRequests; i = next++) {
        const std::string prompt = tenant_request(i).first;
        for (int f = 0; f < 2; ++f) {
          const Replicas& fleet = (i + f) % 2 ? late : direct;
          const auto s = std::chrono::steady_clock::now();
          if (send(fleet.api(i % 3), prompt).status != 200) ++failed;
          const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count();
          std::lock_guard lock(mu);
          (&fleet == &late ? slow_s : fast_s).push_back(took);
        }
      }
    });
  }
  for (auto& c : clients) c.join();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double cpu = redis.cpu_seconds() - cpu0;
  auto mean = [](const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return v.empty() ? 0.0 : s / static_cast<double>(v.size());
  };
  auto p90 = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() * 9 / 10];
  };
  const double rate = 2.0 * kRequests / wall;  // routed requests/s through the one Redis (both fleets)
  std::printf("client latency, Redis direct: mean %.4f s p90 %.4f s; Redis 5 ms late: mean %.4f s p90 %.4f s "
              "(%.3fx, %.3fx)\n",
              mean(fast_s), p90(fast_s), mean(slow_s), p90(slow_s), mean(slow_s) / mean(fast_s), p90(slow_s) / p90(fast_s));
  std::printf("redis-server: %.3f CPU s over %.1f s at %.0f routed requests/s: %.3f CPU cores per 1,000 requests/s\n",
              cpu, wall, rate, cpu / wall / (rate / 1000.0));
  EXPECT_EQ(failed.load(), 0);
  EXPECT_LE(mean(slow_s), 1.10 * mean(fast_s));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(metric(late.admin(i), "kvroute_shared_state_up"), 1) << i;
}

TEST(ReplicasE2E, NewReplicaStartsWarm) {
  if (!redis_available()) GTEST_SKIP() << "redis-server is not installed";
  Redis redis;
  Replicas fleet(2, &redis, kTenantBlocks);
  // Traffic on the first two, then a third replica joins and takes its share of the same workload.
  Result before = run(fleet, 160, 4, tenant_request);
  EXPECT_EQ(before.failed, 0);
  const auto t0 = std::chrono::steady_clock::now();
  const int fresh = fleet.add();
  const double startup = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // What it replayed of the others' routing is bounded by each worker's capacity as soon as the worker's metrics
  // give it, before it routes there: it does not believe a worker holds prefixes the worker evicted long ago.
  bool bounded = false;
  std::string seen;
  for (int tries = 0; tries < 40 && !bounded; ++tries) {
    const json::array workers = fleet.workers(fresh);
    bounded = workers.size() == kWorkers;
    seen.clear();
    for (const auto& w : workers) {
      const double held = w.at("indexed_blocks").to_number<double>();
      const double capacity = w.as_object().contains("num_gpu_blocks") ? w.at("num_gpu_blocks").to_number<double>() : 0;
      bounded = bounded && capacity > 0 && held <= capacity;
      seen += " " + std::to_string(static_cast<int>(held)) + "/" + std::to_string(static_cast<int>(capacity));
    }
    if (!bounded) std::this_thread::sleep_for(50ms);
  }
  EXPECT_TRUE(bounded) << "indexed blocks / capacity per worker:" << seen;
  // 80 requests each: one deliberate copy of a busy holder's prefix (kv_cost may make one when the copy is
  // cheap) moves the hit rate by about 1 %, well within the limit, where over 40 it took 2.5 % of the 3 %.
  auto later = [](int i) { return tenant_request(160 + i); };
  Result mine = run(fleet, 80, 4, later, fresh);
  Result others = run(fleet, 80, 4, [&](int i) { return tenant_request(240 + i); }, 0);
  std::printf("new replica ready in %.2f s; its hit rate %.3f, an old replica's %.3f\n", startup, mine.hit_rate(),
              others.hit_rate());
  EXPECT_LT(startup, 5.0);
  EXPECT_GE(mine.hit_rate(), 0.97 * others.hit_rate());
}

// Tenants as token ids (precise mode: the workers' events name token blocks): 32 shared prefixes of 1,024
// tokens, request i tenant i % 32's plus its own 64 tokens.
json::array tenant_tokens(int i) {
  const int tenant = i % 32;
  json::array prompt;
  std::uint64_t x = 1000 + static_cast<std::uint64_t>(tenant);
  for (int t = 0; t < 1024 + 64; ++t) {
    if (t == 1024) x = 900000 + static_cast<std::uint64_t>(i);
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    prompt.push_back(static_cast<std::int64_t>(1000 + (x >> 33) % 50000));
  }
  return prompt;
}

Sent send_tokens(int port, const json::array& prompt) {
  json::object body{{"model", "qwen3-8b"}, {"prompt", prompt}, {"max_tokens", 4}};
  auto r = http(port, "POST", "/v1/completions", json::serialize(body));
  Sent s;
  s.status = r.status;
  if (r.status != 200) return s;
  s.worker = r.header("x-kvroute-worker");
  auto v = json::parse(r.body);
  s.prompt = v.at("usage").at("prompt_tokens").to_number<double>();
  s.cached = v.at("usage").at("prompt_tokens_details").at("cached_tokens").to_number<double>();
  return s;
}

// Requests [from, to) of tenant_tokens through replica i % size (or only `only`), from `threads` clients.
Result run_tokens(const Replicas& fleet, int from, int to, int threads, int only = -1) {
  return run_each(from, to, threads, [&](int i) {
    return send_tokens(fleet.api(only >= 0 ? only : i % fleet.size()), tenant_tokens(i));
  });
}

TEST(ReplicasE2E, PreciseHitRateMatchesOneReplica) {
  if (!redis_available()) GTEST_SKIP() << "redis-server is not installed";
  // In rounds of the 32 tenants (4 clients each round): what is compared is what the replicas know of one
  // another's requests, not two requests for one new prefix racing at two replicas within the stream's
  // latency (which one replica would have held; docs/operations.md, "Consistency").
  auto rounds = [](const Replicas& fleet) {
    Result sum;
    for (int r = 0; r < 10; ++r) {
      sum.add(run_tokens(fleet, r * 32, (r + 1) * 32, 4));
    }
    return sum;
  };
  Result one, three;
  {
    Replicas fleet(1, nullptr, 4096, "", /*precise=*/true);
    one = rounds(fleet);
  }
  Redis redis;
  {
    Replicas fleet(3, &redis, 4096, "", /*precise=*/true);
    three = rounds(fleet);
  }
  std::printf("precise tenants: 1 replica hit %.3f, 3 replicas %.3f (%.3fx)\n", one.hit_rate(), three.hit_rate(),
              three.hit_rate() / one.hit_rate());
  EXPECT_EQ(one.failed + three.failed, 0);
  EXPECT_GE(three.hit_rate(), 0.99 * one.hit_rate());
}

// kv_cost's prefix hold across replicas (router/router.h, Router::prefix_held). A request for a 12K-token prefix
// goes through replica 0; while its worker computes that prefix, a second request for it reaches replica 1,
// which knows the first from its routed record and holds the second rather than have the worker compute the
// prefix again. The workers' KV events come 0.6 s late (a busy publisher, a slow network): the hold ends with
// the first request's first token, which replica 0 passes on through Redis, not with the event.
TEST(ReplicasE2E, APrefixHoldOnOneReplicaEndsWithAnotherReplicasFirstToken) {
  if (!redis_available()) GTEST_SKIP() << "redis-server is not installed";
  Redis redis;
  // Workers at twice real time (the 12K-token prefill takes about 0.15 s) and the priors to match (see
  // kPrefillPrior); holds last up to 2 s, so only the first token or the event can end one early.
  Replicas fleet(2, &redis, 4096, "", /*precise=*/true,
                 {"--prefill-tokens-per-s", "53000", "--decode-step-s", "0.0035", "--prefix-hold", "2"},
                 {"--speed", "2", "--kv-events-delay", "0.6"});
  std::mt19937_64 rng(11);
  json::array prefix;
  for (int t = 0; t < 12288; ++t) prefix.push_back(static_cast<std::int64_t>(1000 + rng() % 50000));
  auto body = [&](int tail, bool stream) {
    json::array prompt = prefix;
    for (int t = 0; t < 32; ++t) prompt.push_back(static_cast<std::int64_t>(60000 + tail * 100 + t));
    json::object b{{"model", "qwen3-8b"}, {"prompt", prompt}, {"max_tokens", 4}, {"stream", stream}};
    return json::serialize(b);
  };
  // Both requests go to worker 0, the others cordoned (on every replica): on an idle fleet whose caches hold
  // nothing reused, kv_cost may as well compute the prefix again on an idle worker, and what is tested here is
  // the hold across replicas.
  for (int w = 1; w < kWorkers; ++w) {
    ASSERT_EQ(http(fleet.admin(0), "POST", "/admin/workers/" + fleet.worker_name(w) + "/cordon").status, 200);
  }
  const auto cordoned_by = std::chrono::steady_clock::now() + 2s;
  while (!fleet.cordoned_on(1, fleet.worker_name(kWorkers - 1)) && std::chrono::steady_clock::now() < cordoned_by) {
    std::this_thread::sleep_for(5ms);
  }
  // The records replica 1 has applied from the others (GET /admin/status, shared_state.applied).
  auto applied = [&] {
    const auto r = http(fleet.admin(1), "GET", "/admin/status");
    return r.status == 200 ? json::parse(r.body).at("shared_state").at("applied").to_number<double>() : -1.0;
  };
  const double applied_before = applied();
  const auto sent = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point first_piece{};
  HttpResponse first;
  std::thread leader([&] {
    first = http_stream(fleet.api(0), "POST", "/v1/completions", body(1, true), {},
                        [&](const std::string& piece, std::chrono::steady_clock::time_point at) {
                          if (first_piece == std::chrono::steady_clock::time_point{} && piece.find("data:") != std::string::npos)
                            first_piece = at;
                        });
  });
  // Once replica 1 has applied the first one's routed record (within milliseconds of its routing).
  const auto routed_by = sent + 5s;
  while (applied() <= applied_before && std::chrono::steady_clock::now() < routed_by) std::this_thread::sleep_for(2ms);
  const double second_sent_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count();
  const HttpResponse second = http(fleet.api(1), "POST", "/v1/completions", body(2, false));
  leader.join();
  ASSERT_EQ(first.status, 200) << first.error;
  ASSERT_EQ(second.status, 200) << second.body << second.error;
  const double first_token_s = std::chrono::duration<double>(first_piece - sent).count();
  const auto usage = json::parse(second.body).at("usage");
  const double cached = usage.at("prompt_tokens_details").at("cached_tokens").to_number<double>();
  const double holds = metric(fleet.admin(1), "kvroute_prefix_holds_total");
  const double held_s = metric(fleet.admin(1), "kvroute_prefix_hold_seconds_total");
  std::printf("cross-replica hold: first token at %.3f s, second sent at %.3f s, held %.3f s, cached %.0f tokens\n",
              first_token_s, second_sent_s, held_s, cached);
  EXPECT_EQ(second.header("x-kvroute-worker"), first.header("x-kvroute-worker"));
  EXPECT_EQ(holds, 1.0);
  EXPECT_GE(cached, 12288.0);  // the whole prefix, read from the worker's cache
  // Ended by the first token (plus Redis's round trips), long before the 0.6 s late event.
  EXPECT_LT(second_sent_s + held_s, first_token_s + 0.2);
}

// A replica joining a busy fleet in precise mode replays every worker's event buffer before it is ready: the
// replays finish (no failure, no reset of a worker's entries), and within 5 s its own requests hit as often as
// an old replica's.
TEST(ReplicasE2E, NewReplicaInPreciseModeJoinsABusyFleet) {
  if (!redis_available()) GTEST_SKIP() << "redis-server is not installed";
  Redis redis;
  Replicas fleet(2, &redis, 4096, "", /*precise=*/true);
  EXPECT_EQ(run_tokens(fleet, 0, 160, 4).failed, 0);
  std::atomic<bool> stop{false};
  std::atomic<int> background_failed{0};
  std::vector<std::thread> busy;
  const int old_ports[2] = {fleet.api(0), fleet.api(1)};  // read before fleet.add() grows the fleet's lists
  for (int t = 0; t < 3; ++t) {
    busy.emplace_back([&, t] {
      for (int i = 0; !stop; ++i) {
        if (send_tokens(old_ports[(t + i) % 2], tenant_tokens(10000 + t * 100000 + i)).status != 200) ++background_failed;
      }
    });
  }
  std::this_thread::sleep_for(500ms);
  const auto t0 = std::chrono::steady_clock::now();
  const int fresh = fleet.add();
  const double startup = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  Result mine = run_tokens(fleet, 160, 240, 4, fresh);  // 80 each, as in NewReplicaStartsWarm
  Result others = run_tokens(fleet, 240, 320, 4, 0);
  const double within = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stop = true;
  for (auto& b : busy) b.join();
  std::printf("precise: new replica ready in %.2f s; its hit rate %.3f, an old replica's %.3f (measured by %.2f s)\n",
              startup, mine.hit_rate(), others.hit_rate(), within);
  EXPECT_EQ(background_failed.load(), 0);
  EXPECT_EQ(mine.failed + others.failed, 0);
  EXPECT_LT(within, 5.0);
  EXPECT_GE(mine.hit_rate(), 0.97 * others.hit_rate());
  const json::array workers = fleet.workers(fresh);
  EXPECT_EQ(workers.size(), kWorkers);
  for (const auto& w : workers) {
    const auto& ev = w.at("kv_events");
    EXPECT_EQ(ev.at("replay_failures").to_number<int>(), 0) << json::serialize(w);
    EXPECT_EQ(ev.at("resets").to_number<int>(), 0) << json::serialize(w);
    EXPECT_EQ(ev.at("orphan_events").to_number<int>(), 0) << json::serialize(w);  // it replayed from the start
    EXPECT_EQ(ev.at("unsupported_events").to_number<int>(), 0) << json::serialize(w);
  }
  EXPECT_EQ(fleet.log_text(fresh).find("could not fill"), std::string::npos);
  // Every replica counts about the same blocks of each worker as held for reuse, what kv_cost prices a copy by:
  // the fresh one from the events it replayed, the old one from the events it received as they came (measured
  // within a few per cent of each other; a predicted block not yet confirmed does not count).
  auto reused = [&](int replica) {
    std::map<std::string, double> out;
    for (const auto& w : fleet.workers(replica)) out[std::string(w.at("name").as_string())] = w.at("reused_blocks").to_number<double>();
    return out;
  };
  std::this_thread::sleep_for(200ms);  // the last events on their way
  const auto theirs = reused(0), ours = reused(fresh);
  EXPECT_EQ(theirs.size(), kWorkers);
  for (const auto& [name, blocks] : theirs) {
    EXPECT_GT(blocks, 0) << name;
    EXPECT_GE(ours.at(name), 0.9 * blocks) << name;
  }
}

}  // namespace
}  // namespace kvroute::test
