// Engine: scheduler (chunked prefill, running cap, preemption), prefix caching as seen through requests,
// the eviction scenario of issue 3, the CPU tier, and the KV events mirroring cached_block_hashes().
// Everything runs in virtual time; nothing here measures wall-clock time.
#include "backends/sim/engine.h"

#include <map>
#include <set>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

namespace kvroute::sim {
namespace {

// Mirrors the cache from the KV events and records what each request saw.
struct MirrorSink : EngineSink {
  std::set<std::uint64_t> gpu, cpu;
  std::map<std::uint64_t, double> first_token;
  std::map<std::uint64_t, std::uint32_t> cached, tokens;
  std::map<std::uint64_t, Usage> finished;
  std::map<std::uint64_t, double> finish_time;
  std::ostringstream log;  // everything, for determinism checks
  double last_t = 0;
  bool time_went_back = false;

  void saw(double t) {
    if (t < last_t) time_went_back = true;
    last_t = t;
  }
  void on_first_token(std::uint64_t id, double t, std::uint32_t c, std::uint32_t p) override {
    saw(t);
    first_token[id] = t;
    cached[id] = c;
    log << "F" << id << "@" << t << ":" << c << "/" << p << "\n";
  }
  void on_token(std::uint64_t id, double t, std::uint32_t index) override {
    saw(t);
    EXPECT_EQ(index, tokens[id]) << "request " << id;
    tokens[id] = index + 1;
    log << "T" << id << "." << index << "@" << t << "\n";
  }
  void on_finish(std::uint64_t id, double t, const Usage& u) override {
    saw(t);
    finished[id] = u;
    finish_time[id] = t;
    log << "E" << id << "@" << t << "\n";
  }
  void on_blocks_stored(std::span<const std::uint64_t> hashes, std::optional<std::uint64_t> parent, std::uint64_t req,
                        std::uint32_t first, Medium m, double t) override {
    saw(t);
    auto& set = m == Medium::kGpu ? gpu : cpu;
    for (auto h : hashes) {
      EXPECT_TRUE(set.insert(h).second) << "stored twice on " << medium_name(m) << ": " << h;
    }
    log << "S" << medium_name(m) << req << "." << first << "x" << hashes.size() << "\n";
  }
  void on_blocks_removed(std::span<const std::uint64_t> hashes, Medium m, double t) override {
    saw(t);
    auto& set = m == Medium::kGpu ? gpu : cpu;
    for (auto h : hashes) EXPECT_EQ(set.erase(h), 1u) << "removed but not held: " << h;
    log << "R" << medium_name(m) << hashes.size() << "\n";
  }
  void on_all_cleared(double t) override {
    gpu.clear();
    cpu.clear();
    log << "C\n";
  }
  std::vector<std::uint64_t> sorted(const std::set<std::uint64_t>& s) const { return {s.begin(), s.end()}; }
};

// A chain of `blocks` hashes unique to `session`, optionally sharing the first `shared` blocks of session 0.
std::vector<std::uint64_t> chain(std::uint64_t session, std::uint32_t blocks, std::uint32_t shared = 0) {
  std::vector<std::uint64_t> h(blocks);
  for (std::uint32_t i = 0; i < blocks; ++i) h[i] = (i < shared ? 0 : session) * 0x9E3779B97F4A7C15ull + i + 1;
  return h;
}

SimRequest request(std::uint64_t id, std::uint32_t prompt, std::uint32_t max_tokens, std::uint64_t session,
                   std::uint32_t shared_blocks = 0) {
  return SimRequest{id, chain(session, prompt / 16, shared_blocks), prompt, max_tokens};
}

void run_until_idle(Engine& e, EngineSink& sink) {
  for (double t = e.next_event_time(); t < kInfinity; t = e.next_event_time()) e.advance(t, sink);
}

EngineConfig small_config(std::uint64_t blocks) {
  EngineConfig c = EngineConfig::defaults();
  c.num_gpu_blocks = blocks;
  return c;
}

TEST(Engine, IdleEngineHasNoEvents) {
  Engine e(EngineConfig::defaults());
  EXPECT_EQ(e.next_event_time(), kInfinity);
  EXPECT_EQ(e.stats().num_gpu_blocks, 24252u);  // Qwen3-8B on an H100: 53.1 GiB pool / (16 x 144 KiB)
}

TEST(Engine, SubmitErrors) {
  Engine e(small_config(100));
  EXPECT_TRUE(e.submit(request(1, 160, 4, 1), 0).ok());
  EXPECT_FALSE(e.submit(request(1, 160, 4, 2), 0).ok());  // duplicate id
  EXPECT_FALSE(e.submit(SimRequest{2, {}, 0, 4}, 0).ok());
  EXPECT_TRUE(e.submit(request(4, 1600, 1, 4), 0).ok());  // 1600 tokens of KV: fits exactly
  auto big = e.submit(request(3, 1600, 2, 3), 0);  // 1601 tokens of KV > 1600-token pool
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.error().message.find("1600"), std::string::npos);
}

TEST(Engine, FrontEndDelayThenFirstToken) {
  Engine e(EngineConfig::defaults());
  MirrorSink s;
  auto a = e.submit(request(1, 1000, 3, 1), 5.0);
  ASSERT_TRUE(a.ok());
  const EngineConfig& c = e.config();
  EXPECT_DOUBLE_EQ(a->ready_time, 5.0 + c.frontend_overhead_s + 1000 * c.frontend_s_per_prompt_token);
  EXPECT_DOUBLE_EQ(e.next_event_time(), a->ready_time);
  EXPECT_EQ(e.stats().waiting, 1u);
  run_until_idle(e, s);
  EXPECT_GT(s.first_token[1], a->ready_time);
  EXPECT_EQ(s.tokens[1], 3u);
  ASSERT_EQ(s.finished.count(1), 1u);
  EXPECT_EQ(s.finished[1].prompt_tokens, 1000u);
  EXPECT_EQ(s.finished[1].completion_tokens, 3u);
  EXPECT_EQ(s.finished[1].cached_tokens, 0u);
  EXPECT_FALSE(s.time_went_back);
  EXPECT_EQ(e.stats().running, 0u);
  EXPECT_EQ(e.stats().kv_usage, 0.0);
}

// Two prompts sharing 200 blocks arrive together and are admitted into the same step. Whether the second hits
// the first's blocks depends on when the engine commits them: after the step (SGLang) or when the step is
// scheduled (vLLM v1, whose allocate_slots caches the scheduled blocks before the forward pass).
TEST(Scheduler, PrefixCommitDecidesWhetherASameStepFollowerHits) {
  for (const PrefixCommit commit : {PrefixCommit::kStepEnd, PrefixCommit::kSchedule}) {
    EngineConfig c = EngineConfig::defaults();
    c.prefix_commit = commit;
    Engine e(c);
    MirrorSink s;
    ASSERT_TRUE(e.submit(request(1, 4096, 2, 0), 0).ok());
    ASSERT_TRUE(e.submit(request(2, 4096, 2, 2, 200), 0).ok());
    run_until_idle(e, s);
    EXPECT_EQ(s.first_token[1], s.first_token[2]) << "both prefills should share one step";
    EXPECT_EQ(s.cached[2], commit == PrefixCommit::kSchedule ? 200u * 16 : 0u);
    EXPECT_EQ(s.sorted(s.gpu), e.cached_block_hashes(Medium::kGpu));
    EXPECT_FALSE(s.time_went_back);
  }
  EXPECT_EQ(*parse_prefix_commit("schedule"), PrefixCommit::kSchedule);
  EXPECT_EQ(*parse_prefix_commit("step-end"), PrefixCommit::kStepEnd);
  auto bad = parse_prefix_commit("later");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("step-end or schedule"), std::string::npos);
}

TEST(Scheduler, ChunkedPrefillSplitsALongPromptByTheTokenBudget) {
  EngineConfig c = EngineConfig::defaults();
  c.max_batched_tokens = 8192;
  Engine e(c);
  MirrorSink s;
  e.submit(request(1, 20000, 1, 1), 0);
  run_until_idle(e, s);
  EXPECT_EQ(e.stats().steps, 3u);  // 8192 + 8192 + 3616
  EXPECT_EQ(e.stats().prompt_tokens_computed, 20000u);
  // Each chunk is stored as soon as it is computed: 512 + 512 + 226 blocks.
  EXPECT_NE(s.log.str().find("SGPU1.0x512\nSGPU1.512x512\nSGPU1.1024x226\n"), std::string::npos) << s.log.str();
}

TEST(Scheduler, DecodesShareStepsWithAPrefillChunk) {
  Engine e(EngineConfig::defaults());
  MirrorSink s;
  e.submit(request(1, 100, 50, 1), 0);
  e.advance(0.1, s);  // request 1 is decoding
  ASSERT_EQ(s.tokens[1] > 0, true);
  e.submit(request(2, 4000, 1, 2), 0.1);
  run_until_idle(e, s);
  EXPECT_EQ(s.tokens[1], 50u);
  // Request 1 kept decoding while request 2 prefilled: its token stream has no gap of two prefill steps.
  EXPECT_EQ(s.finished.size(), 2u);
}

TEST(Scheduler, RunningCapKeepsTheRestWaiting) {
  EngineConfig c = EngineConfig::defaults();
  c.max_num_seqs = 2;
  Engine e(c);
  MirrorSink s;
  for (std::uint64_t i = 1; i <= 3; ++i) e.submit(request(i, 64, 20, i), 0);
  e.advance(0.1, s);  // a few decode steps in
  EXPECT_EQ(e.stats().running, 2u);
  EXPECT_EQ(e.stats().waiting, 1u);
  EXPECT_EQ(s.first_token.count(3), 0u);
  run_until_idle(e, s);
  ASSERT_EQ(s.finished.size(), 3u);
  // The third starts only after one of the first two left.
  EXPECT_GE(s.first_token[3], std::min(s.finish_time[1], s.finish_time[2]));
  EXPECT_EQ(s.tokens[3], 20u);
}

TEST(Scheduler, PreemptionByRecomputeWhenBlocksRunOut) {
  Engine e(small_config(20));  // 320 tokens of KV
  MirrorSink s;
  e.submit(request(1, 64, 200, 1), 0);  // each grows to 17 blocks; together they need 34
  e.submit(request(2, 64, 200, 2), 0);
  run_until_idle(e, s);
  ASSERT_EQ(s.finished.size(), 2u);
  EXPECT_EQ(s.tokens[1], 200u);  // MirrorSink also checks that indices arrive in order, each once
  EXPECT_EQ(s.tokens[2], 200u);
  EXPECT_GE(e.stats().preemptions, 1u);
  // The older request keeps running; the newer one is the victim and finishes later.
  EXPECT_LT(s.first_token[1], s.first_token[2] + 1);
  EXPECT_EQ(e.stats().kv_usage, 0.0);
  EXPECT_EQ(s.sorted(s.gpu), e.cached_block_hashes(Medium::kGpu));
}

TEST(PrefixCache, RepeatedPromptIsServedFromCacheButNotItsLastToken) {
  Engine e(EngineConfig::defaults());
  MirrorSink s;
  e.submit(request(1, 1000, 1, 7), 0);
  run_until_idle(e, s);
  e.submit(request(2, 1000, 1, 7), 10);
  run_until_idle(e, s);
  EXPECT_EQ(s.cached[1], 0u);
  EXPECT_EQ(s.cached[2], 992u);  // 62 full blocks; the 8-token tail is never cached
  // A prompt of whole blocks recomputes its last block: vLLM must compute at least one token.
  e.submit(request(3, 1024, 1, 8), 20);
  run_until_idle(e, s);
  e.submit(request(4, 1024, 1, 8), 30);
  run_until_idle(e, s);
  EXPECT_EQ(s.cached[4], 1008u);
  EXPECT_EQ(s.finished[4].cached_tokens, 1008u);
  const EngineStats st = e.stats();
  EXPECT_EQ(st.prefix_cache_queries, 4048u);
  EXPECT_EQ(st.prefix_cache_hits, 2000u);
  // Warm requests are much faster than cold ones.
  EXPECT_LT(s.first_token[2] - 10, (s.first_token[1] - 0) * 0.9);
}

TEST(PrefixCache, SharedPrefixHitsAcrossSessions) {
  Engine e(EngineConfig::defaults());
  MirrorSink s;
  e.submit(request(1, 3200, 1, 1, 100), 0);  // 200 blocks, the first 100 shared with session 0
  run_until_idle(e, s);
  e.submit(request(2, 3200, 1, 2, 100), 10);
  run_until_idle(e, s);
  EXPECT_EQ(s.cached[2], 1600u);
}

TEST(PrefixCache, OutputBlocksAreCachedWhenTheCallerGivesTheirHashes) {
  Engine e(EngineConfig::defaults());
  MirrorSink s;
  SimRequest r{1, chain(3, 10), 100, 60};  // 6 prompt blocks + 4 blocks ending inside the output
  e.submit(r, 0);
  run_until_idle(e, s);
  // 100 + 60 tokens, of which 159 computed (the last sampled token never is): 9 full blocks.
  EXPECT_EQ(e.cached_block_hashes(Medium::kGpu).size(), 9u);
}

// Issue 3: a pool of about 71,000 tokens and eight 16K-token sessions opened one after another (each
// finishes before the next starts): the four newest are fully cached, the three oldest are gone, and the
// one in between keeps its beginning and has lost its end.
TEST(Eviction, EightSessionsInA71kTokenPool) {
  Engine e(small_config(71000 / 16));
  MirrorSink s;
  double now = 0;
  for (std::uint64_t k = 1; k <= 8; ++k) {
    ASSERT_TRUE(e.submit(request(k, 16384, 1, k), now).ok());
    run_until_idle(e, s);
    ASSERT_EQ(s.finished.count(k), 1u);
    now = s.last_t + 1;
  }
  const auto held = e.cached_block_hashes(Medium::kGpu);
  const std::set<std::uint64_t> gpu(held.begin(), held.end());
  auto leading = [&](std::uint64_t k) {
    const auto h = chain(k, 1024);
    std::uint32_t n = 0;
    while (n < h.size() && gpu.count(h[n])) ++n;
    std::uint32_t total = 0;
    for (auto x : h) total += gpu.count(x);
    EXPECT_EQ(n, total) << "session " << k << " holds blocks after a gap";
    return n;
  };
  for (std::uint64_t k = 1; k <= 3; ++k) EXPECT_EQ(leading(k), 0u) << "session " << k;
  const std::uint32_t middle = leading(4);
  EXPECT_GT(middle, 0u);
  EXPECT_LT(middle, 1024u);
  EXPECT_EQ(middle, 4437u - 4 * 1024u);  // what the four newest leave of the pool
  for (std::uint64_t k = 5; k <= 8; ++k) EXPECT_EQ(leading(k), 1024u) << "session " << k;
  EXPECT_EQ(e.stats().gpu_evictions, 8u * 1024 - 4437);
  // And a new request of session 4 is served its beginning from cache.
  e.submit(request(99, 16384, 1, 4), now);
  run_until_idle(e, s);
  EXPECT_EQ(s.cached[99], middle * 16);
}

TEST(CpuTier, EvictedPrefixIsLoadedBackAndReportedAsCached) {
  EngineConfig c = small_config(1024);  // one 16K request at a time
  c.cpu_tier_bytes = 4.0 * 16384 * c.model.kv_bytes_per_token();
  Engine e(c);
  MirrorSink s;
  e.submit(request(1, 16384, 1, 1), 0);
  run_until_idle(e, s);
  e.submit(request(2, 16384, 1, 2), 10);  // pushes session 1 to the CPU tier
  run_until_idle(e, s);
  EXPECT_EQ(e.cached_block_hashes(Medium::kCpu).size(), 1024u);
  e.submit(request(3, 16384, 1, 1), 20);
  run_until_idle(e, s);
  EXPECT_EQ(s.cached[3], 1023u * 16);
  EXPECT_EQ(e.stats().cpu_cache_hits, 1023u * 16);
  EXPECT_EQ(e.stats().prefix_cache_hits, 0u);
  const double ttft = s.first_token[3] - 20;
  EXPECT_GT(ttft, 0.1);  // the load costs ~90 ms, far less than recomputing (~0.5 s)
  EXPECT_LT(ttft, 0.3);
  EXPECT_EQ(s.sorted(s.gpu), e.cached_block_hashes(Medium::kGpu));
  EXPECT_EQ(s.sorted(s.cpu), e.cached_block_hashes(Medium::kCpu));
}

TEST(Engine, CancelFreesBlocksAndSilencesTheRequest) {
  Engine e(EngineConfig::defaults());
  MirrorSink s;
  e.submit(request(1, 20000, 10, 1), 0);
  e.submit(request(2, 160, 10, 2), 0);
  e.advance(0.2, s);  // request 1 is mid-prefill, a step in flight
  EXPECT_TRUE(e.cancel(1, 0.2));
  EXPECT_FALSE(e.cancel(1, 0.2));
  run_until_idle(e, s);
  EXPECT_EQ(s.first_token.count(1), 0u);
  EXPECT_EQ(s.finished.count(1), 0u);
  EXPECT_EQ(s.tokens[2], 10u);
  EXPECT_EQ(e.stats().kv_usage, 0.0);
  EXPECT_EQ(e.stats().requests_cancelled, 1u);
  // Cancelled in the front end: nothing at all happens for it.
  e.submit(request(3, 160, 10, 3), 50);
  EXPECT_TRUE(e.cancel(3, 50));
  EXPECT_EQ(e.next_event_time(), 50);  // a harmless scheduling pass
  run_until_idle(e, s);
  EXPECT_EQ(s.tokens.count(3), 0u);
}

TEST(Engine, ResetPrefixCacheOnlyWhenIdle) {
  Engine e(EngineConfig::defaults());
  MirrorSink s;
  e.submit(request(1, 320, 100, 1), 0);
  e.advance(0.2, s);
  EXPECT_FALSE(e.reset_prefix_cache(0.2, s));
  run_until_idle(e, s);
  EXPECT_FALSE(e.cached_block_hashes(Medium::kGpu).empty());
  EXPECT_TRUE(e.reset_prefix_cache(s.last_t, s));
  EXPECT_TRUE(e.cached_block_hashes(Medium::kGpu).empty());
  EXPECT_TRUE(s.gpu.empty());
}

// A busy, mixed workload (shared prefixes, a small pool, a CPU tier, preemptions, cancellations): after every
// call the cache rebuilt from the events equals cached_block_hashes(), and two runs are identical.
std::string mixed_workload(bool check_mirror, EngineStats* out = nullptr,
                           PrefixCommit commit = PrefixCommit::kStepEnd) {
  EngineConfig c = small_config(600);
  c.prefix_commit = commit;
  c.cpu_tier_bytes = 300.0 * 16 * c.model.kv_bytes_per_token();
  c.max_batched_tokens = 2048;
  Engine e(c);
  MirrorSink s;
  std::uint64_t x = 12345;  // fixed LCG: the test is deterministic
  auto rnd = [&](std::uint64_t n) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return (x >> 33) % n;
  };
  double now = 0;
  for (std::uint64_t id = 1; id <= 300; ++id) {
    now += 0.01 * static_cast<double>(rnd(20));
    e.advance(now, s);
    const std::uint64_t session = rnd(12);
    const std::uint32_t prompt = 16 * static_cast<std::uint32_t>(20 + rnd(200)) + static_cast<std::uint32_t>(rnd(16));
    const std::uint32_t shared = static_cast<std::uint32_t>(rnd(2) ? 10 + rnd(20) : 0);
    auto r = request(id, prompt, 1 + static_cast<std::uint32_t>(rnd(300)), session, shared);
    EXPECT_TRUE(e.submit(std::move(r), now).ok());
    if (rnd(10) == 0) e.cancel(id - rnd(5), now);
    if (check_mirror) {
      EXPECT_EQ(s.sorted(s.gpu), e.cached_block_hashes(Medium::kGpu)) << "after request " << id;
      EXPECT_EQ(s.sorted(s.cpu), e.cached_block_hashes(Medium::kCpu)) << "after request " << id;
    }
  }
  run_until_idle(e, s);
  if (check_mirror) {
    EXPECT_EQ(s.sorted(s.gpu), e.cached_block_hashes(Medium::kGpu));
    EXPECT_EQ(s.sorted(s.cpu), e.cached_block_hashes(Medium::kCpu));
    EXPECT_FALSE(s.time_went_back);
  }
  if (out) *out = e.stats();
  return s.log.str();
}

TEST(KvEvents, ApplyingTheEventsReproducesTheCache) {
  for (const PrefixCommit commit : {PrefixCommit::kStepEnd, PrefixCommit::kSchedule}) {
    EngineStats st;
    mixed_workload(true, &st, commit);
    // The workload really exercised what it claims to.
    EXPECT_GT(st.gpu_evictions, 0u);
    EXPECT_GT(st.cpu_evictions, 0u);
    EXPECT_GT(st.cpu_cache_hits, 0u);
    EXPECT_GT(st.prefix_cache_hits, 0u);
    EXPECT_GT(st.preemptions, 0u);
    EXPECT_GT(st.requests_cancelled, 0u);
    EXPECT_EQ(st.running, 0u);
    EXPECT_EQ(st.waiting, 0u);
  }
}

TEST(Engine, Deterministic) { EXPECT_EQ(mixed_workload(false), mixed_workload(false)); }

TEST(Engine, StepTimeRooflineLowerBound) {
  // Llama-3.1-8B, 32 running 8K-token sequences on an H100: >= (16.1 GB + 32 GiB) / 3.35 TB/s.
  Engine e(EngineConfig::make("llama-3.1-8b", "h100-80gb").value());
  std::vector<std::uint32_t> ctx(32, 8192);
  EXPECT_GE(e.step_time({}, ctx), (16.1e9 + 32.0 * 1073741824.0) / 3.35e12);
  // A single decode pays at least the weights and the overhead.
  std::vector<std::uint32_t> one(1, 1);
  EXPECT_GE(e.step_time({}, one), 16.06e9 / 3.35e12 + e.config().step_overhead_s);
}

}  // namespace
}  // namespace kvroute::sim
