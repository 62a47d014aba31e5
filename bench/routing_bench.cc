// Overhead of kvroute's routing decision (architecture section 2: parse, hash, match, pick) and of its
// prefix index (section 5), measured with Google Benchmark.
//
//   BM_RoutingDecision/<workers>/<policy>   the whole decision for an 8K-token chat prompt (about 32 KB of
//                                           canonical text: a system prompt and a few turns)
//   BM_Parse, BM_Canonicalize, BM_Hash, BM_Match/<workers>, BM_Pick/<workers>/<policy>
//                                           the same decision stage by stage
//   BM_RouterRouteShared/<shared>          Router::route with and without --shared-state (ratio in one run)
//   BM_IndexMemory/<entries>                bytes per (block, worker) entry (counter bytes_per_entry)
//   BM_MatchThroughput/<entries>            event-free match() of random chains against a large index
//
// The index is filled the way a fleet fills it: every worker holds the shared system prompt, a spread of
// workers hold longer prefixes of this very conversation (earlier turns), and the rest of the index is other
// conversations that share a few dozen tenant system prompts, recorded on one to three workers each.
//
//   kvroute-routing-bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include <boost/json.hpp>
#include <hiredis/hiredis.h>

#include "backends/shared_state/shared_state.h"
#include "hashing/block_chain.h"
#include "hashing/chat_canonical.h"
#include "hashing/prefix_index.h"
#include "policy/routing_policy.h"
#include "router/request.h"
#include "router/replica_sync.h"
#include "router/router.h"

namespace {

using kvroute::hashing::BlockChain;
using kvroute::hashing::BlockHash;
using kvroute::hashing::PrefixIndex;
using kvroute::hashing::WorkerId;
using kvroute::policy::RoutingContext;
using kvroute::policy::WorkerView;

constexpr const char* kModel = "qwen3-8b";
constexpr std::size_t kPromptBytes = 32 * 1024;   // ~8K tokens at 4 bytes per token
constexpr std::size_t kSystemBytes = 8 * 1024;    // the shared system prompt
constexpr int kTurns = 6;                          // user/assistant messages after the system prompt

// Deterministic English-like text.
std::string words(std::mt19937_64& rng, std::size_t bytes) {
  static const char* kWords[] = {"the", "router", "sends", "each", "request", "to", "a", "worker", "that",
                                 "already", "holds", "its", "prefix", "in", "cache", "so", "prefill", "is",
                                 "skipped", "and", "latency", "drops", "while", "load", "stays", "balanced",
                                 "across", "fleet", "tokens", "blocks", "model", "answer", "question", "with",
                                 "context", "document", "section", "summary", "code", "function", "returns"};
  constexpr std::size_t n = sizeof(kWords) / sizeof(kWords[0]);
  std::string out;
  out.reserve(bytes + 16);
  while (out.size() < bytes) {
    out += kWords[rng() % n];
    out += (rng() % 11 == 0) ? ". " : " ";
  }
  out.resize(bytes);
  return out;
}

// An OpenAI chat request whose canonical text is about kPromptBytes: system prompt, then alternating turns.
// `ask_usage`: whether the body sets stream_options.include_usage (the OpenAI clients' streaming default does
// not, and then the router rewrites the body to ask the worker for usage).
std::string chat_body(bool ask_usage = true) {
  std::mt19937_64 rng(42);
  boost::json::array messages;
  messages.push_back({{"role", "system"}, {"content", words(rng, kSystemBytes)}});
  const std::size_t per_turn = (kPromptBytes - kSystemBytes) / kTurns;
  for (int t = 0; t < kTurns; ++t) {
    messages.push_back({{"role", t % 2 == 0 ? "user" : "assistant"}, {"content", words(rng, per_turn)}});
  }
  boost::json::object body;
  body["model"] = kModel;
  body["messages"] = std::move(messages);
  body["stream"] = true;
  if (ask_usage) body["stream_options"] = {{"include_usage", true}};
  body["max_tokens"] = 256;
  body["user"] = "conversation-17";
  return boost::json::serialize(body);
}

const std::string& body() {
  static const std::string b = chat_body();
  return b;
}

const kvroute::router::RoutableRequest& parsed() {
  static const kvroute::router::RoutableRequest r = [] {
    auto p = kvroute::router::parse_request(kvroute::router::Endpoint::kChatCompletions, body(), {}, {});
    if (!p) std::abort();
    return std::move(*p);
  }();
  return r;
}

std::uint64_t splitmix(std::uint64_t& s) {
  std::uint64_t x = (s += 0x9E3779B97F4A7C15ull);
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The same size of prompt as token ids (a completions request): 8,192 tokens, 512 blocks. In precise mode the
// router records only token chains, which the workers' KV events can confirm.
const kvroute::router::RoutableRequest& parsed_tokens() {
  static const kvroute::router::RoutableRequest r = [] {
    std::string b = R"({"model":")" + std::string(kModel) + R"(","max_tokens":64,"prompt":[)";
    std::uint64_t s = 99;
    for (int t = 0; t < 8192; ++t) {
      if (t) b += ',';
      b += std::to_string(1000 + splitmix(s) % 100000);
    }
    b += "]}";
    auto p = kvroute::router::parse_request(kvroute::router::Endpoint::kCompletions, b, {}, {});
    if (!p) std::abort();
    return std::move(*p);
  }();
  return r;
}

// `n` workers at 10.0.0.1-n:8000 in the registry (the router benchmarks' fleet).
void add_workers(kvroute::backends::WorkerRegistry& registry, int n) {
  for (int i = 0; i < n; ++i) {
    auto ep = kvroute::backends::parse_worker_url("http://10.0.0." + std::to_string(i + 1) + ":8000");
    if (!ep || !registry.add(*ep)) std::abort();
  }
}

// Fills `index` with about `target` entries of other conversations spread over `workers` workers: 64 tenant
// system prompts of 32..160 blocks shared by everyone who uses them, each conversation a prompt plus a unique
// tail of 16..512 blocks, recorded on 1..3 workers (the original and replicas after load spills).
void fill_background(PrefixIndex& index, int workers, std::size_t target, std::uint64_t seed) {
  std::uint64_t s = seed;
  std::vector<std::vector<BlockHash>> systems(64);
  for (auto& sys : systems) {
    sys.resize(32 + splitmix(s) % 129);
    for (auto& h : sys) h = splitmix(s);
  }
  std::vector<BlockHash> chain;
  while (index.entries() < target) {
    const auto& sys = systems[splitmix(s) % systems.size()];
    chain.assign(sys.begin(), sys.end());
    const std::size_t tail = 16 + splitmix(s) % 497;
    for (std::size_t i = 0; i < tail; ++i) chain.push_back(splitmix(s));
    const int copies = 1 + static_cast<int>(splitmix(s) % 3);
    for (int c = 0; c < copies; ++c) index.record(static_cast<WorkerId>(splitmix(s) % workers), chain);
  }
}

// The benchmarked conversation's footprint: every worker holds the system prompt (it is the deployment's
// default), and every fourth worker holds a longer prefix (earlier turns routed there), one of them the
// whole prompt minus its last turn.
void fill_conversation(PrefixIndex& index, int workers, const BlockChain& chain) {
  const std::size_t n = chain.hashes.size();
  const std::size_t system_blocks = kSystemBytes / chain.block_units;
  const std::span<const BlockHash> all(chain.hashes);
  for (int w = 0; w < workers; ++w) {
    std::size_t len = system_blocks;
    if (w % 4 == 0) len = system_blocks + (n - system_blocks) * static_cast<std::size_t>(w + 4) / (workers + 4);
    if (w == workers / 2) len = n - n / (kTurns + 2);
    index.record(static_cast<WorkerId>(w), all.first(std::min(len, n)));
  }
}

// One index per worker count, shared by the benchmarks (building 1M entries takes a moment).
PrefixIndex& decision_index(int workers) {
  static std::map<int, std::unique_ptr<PrefixIndex>> cache;
  auto& slot = cache[workers];
  if (!slot) {
    slot = std::make_unique<PrefixIndex>();
    fill_background(*slot, workers, 1'000'000, 7);
    fill_conversation(*slot, workers, parsed().chain);
  }
  return *slot;
}

std::vector<WorkerView> views(int workers) {
  std::vector<WorkerView> v(static_cast<std::size_t>(workers));
  std::mt19937_64 rng(3);
  for (int i = 0; i < workers; ++i) {
    WorkerView& w = v[static_cast<std::size_t>(i)];
    w.id = static_cast<WorkerId>(i);
    w.in_flight = static_cast<std::uint32_t>(rng() % 24);
    w.pending_prefill_tokens = rng() % 20000;
    w.active_decode_tokens = rng() % 400000;
    w.running = w.in_flight;
    w.waiting = static_cast<std::uint32_t>(rng() % 3);
    w.kv_usage = static_cast<double>(rng() % 100) / 100.0;
    w.capacity_blocks = 3'400'000 / 16;
    w.reused_blocks = rng() % 50000;
  }
  return v;
}

const std::vector<std::string> kPolicies = {"kv_cost", "cache_aware", "round_robin"};

std::unique_ptr<kvroute::policy::RoutingPolicy> policy_named(const std::string& name) {
  auto p = kvroute::policy::make_policy(name, {});
  if (!p) std::abort();
  return std::move(*p);
}

RoutingContext context(const kvroute::router::RoutableRequest& r, const std::vector<WorkerView>& v,
                       const PrefixIndex::Match& m, std::uint64_t seq) {
  RoutingContext ctx;
  ctx.chain = &r.chain;
  ctx.tokens_per_block = r.chain.tokens_per_block();
  ctx.prompt_tokens = r.prompt_tokens;
  ctx.max_tokens = r.max_tokens;
  ctx.workers = v;
  ctx.match = &m;
  ctx.affinity_key = r.affinity_key;
  ctx.sequence = seq;
  ctx.random = seq * 0x9E3779B97F4A7C15ull;
  // A router past its first 45 completions knows the fleet's means (policy/recent_quantile.h); before that,
  // kv_cost prices each candidate twice (once for the scale it assumes until then).
  ctx.fleet_means = {0.2, 0.02, 5.0};
  return ctx;
}

// ---------------------------------------------------------------------------------------------------------
// The whole decision.

void BM_RoutingDecision(benchmark::State& state) {
  const int workers = static_cast<int>(state.range(0));
  const std::string& policy_name = kPolicies[static_cast<std::size_t>(state.range(1))];
  PrefixIndex& index = decision_index(workers);
  const auto v = views(workers);
  const auto policy = policy_named(policy_name);
  const std::string& b = body();
  PrefixIndex::Match m;
  std::uint64_t seq = 0;
  std::uint64_t longest = 0;
  for (auto _ : state) {
    auto r = kvroute::router::parse_request(kvroute::router::Endpoint::kChatCompletions, b, {}, {});
    index.match(r->chain.hashes, m);
    const auto pick = policy->pick(context(*r, v, m, seq++));
    benchmark::DoNotOptimize(pick);
    longest = m.longest;
  }
  state.SetLabel(policy_name);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * b.size()));
  state.counters["blocks"] = static_cast<double>(parsed().chain.hashes.size());
  state.counters["matched_blocks"] = static_cast<double>(longest);
  state.counters["index_entries"] = static_cast<double>(index.entries());
}
BENCHMARK(BM_RoutingDecision)
    ->ArgNames({"workers", "policy"})
    ->ArgsProduct({{16, 64}, {0, 1, 2}})
    ->Unit(benchmark::kMicrosecond);

// The daemon's decision as Router::route makes it, after parsing: the snapshot of 64 workers and their views
// (each worker's lock), learned rates, the model check, match, pick, and recording the routed chain; then
// Router::complete, so the in-flight counts stay level. Arg `models`: 0 = the workers' models are not known
// yet, 1 = every worker lists three models (the request's among them), 2 = half the workers serve another
// model; 3 and 4 = models unknown, and every worker's KV capacity known (25,000 or 4,000 blocks), so the router
// also measures the request against one cache of the fleet's capacity (hashing/shared_cache.h): sampled at 1/8
// or 1/4; 5 = half the workers serve another model and capacities are known (25,000 blocks), so the request is
// measured against its pool's cache (router/cache_pools.h): 32 workers, sampled at 1/8. (With 4,000 the chosen
// worker's entries beyond its capacity are evicted at its next record.) 6 and 7 = every worker in precise mode
// and the prompt as 8,192 token ids: the routed chain is expected (predicted until events confirm it) and,
// with --prefix-hold (6; 7: 0), the blocks it computes are registered for prefix holds.
void BM_RouterRoute(benchmark::State& state) {
  constexpr int kWorkers = 64;
  const int models = static_cast<int>(state.range(0));
  kvroute::router::Config config;
  config.policy = "kv_cost";
  if (models == 7) config.prefix_hold_s = 0;
  kvroute::backends::WorkerRegistry registry;
  kvroute::router::RouterMetrics metrics;
  kvroute::router::Router router(config, registry, policy_named("kv_cost"), metrics);
  add_workers(registry, kWorkers);
  const auto workers = registry.snapshot();  // kept while walked (worker_registry.h)
  for (const auto& w : *workers) {
    if (models == 1) w->set_models({"llama-3.1-8b", kModel, "sql-lora"});
    if (models == 2 || models == 5) w->set_models({w->id() % 2 ? std::string(kModel) : std::string("llama-3.1-8b")});
    if (models >= 6) w->set_precise(true);
  }
  const auto& r = models >= 6 ? parsed_tokens() : parsed();
  fill_background(router.index(), kWorkers, 1'000'000, 7);
  fill_conversation(router.index(), kWorkers, r.chain);
  // Capacities as the workers' metrics would report them, set once the index is filled.
  if (models >= 3) {
    for (const auto& w : *workers) router.index().set_capacity(w->id(), models == 4 ? 4'000 : 25'000);
  }
  for (auto _ : state) {
    auto d = router.route(r);
    if (!d) std::abort();
    state.PauseTiming();
    router.complete(*d, kvroute::router::Outcome{true, std::nullopt});
    state.ResumeTiming();
  }
  static const char* const kLabels[] = {"models unknown", "all serve the model", "half serve it",
                                         "shared cache sampled 1/8", "shared cache sampled 1/4",
                                         "half serve it, its pool's cache sampled 1/8",
                                         "precise mode, token prompt", "precise mode, token prompt, no prefix hold"};
  state.SetLabel(kLabels[models]);
}
BENCHMARK(BM_RouterRoute)->ArgName("models")->DenseRange(0, 7)->Unit(benchmark::kMicrosecond);

// Deletes every key under `prefix` (SCAN MATCH prefix:*, then UNLINK): what a benchmark run left in Redis.
void drop_keys(const std::string& url, const std::string& prefix) {
  const auto u = kvroute::shared_state::parse_redis_url(url);
  if (!u) return;
  redisContext* c = redisConnect(u->host.c_str(), u->port);
  if (!c || c->err) {
    if (c) redisFree(c);
    return;
  }
  auto command = [&](std::vector<std::string> args) {
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const auto& a : args) argv.push_back(a.data()), lens.push_back(a.size());
    return static_cast<redisReply*>(redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data()));
  };
  if (!u->password.empty()) {
    std::vector<std::string> auth{"AUTH"};
    if (!u->user.empty()) auth.push_back(u->user);
    auth.push_back(u->password);
    if (auto* r = command(auth)) freeReplyObject(r);
  }
  if (u->db != 0) {
    if (auto* r = command({"SELECT", std::to_string(u->db)})) freeReplyObject(r);
  }
  std::string cursor = "0";
  do {
    redisReply* r = command({"SCAN", cursor, "MATCH", prefix + ":*", "COUNT", "1000"});
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2) {
      if (r) freeReplyObject(r);
      break;
    }
    cursor.assign(r->element[0]->str, r->element[0]->len);
    std::vector<std::string> unlink{"UNLINK"};
    for (std::size_t i = 0; i < r->element[1]->elements; ++i) {
      unlink.emplace_back(r->element[1]->element[i]->str, r->element[1]->element[i]->len);
    }
    freeReplyObject(r);
    if (unlink.size() > 1) {
      if (auto* d = command(unlink)) freeReplyObject(d);
    }
  } while (cursor != "0");
  redisFree(c);
}

// Router::route with and without router replicas sharing state (--shared-state, router/replica_sync.h), in one
// run so their ratio compares: Arg 0 = no shared state; 1 = a ReplicaSync attached to the Redis named by
// $KVROUTE_BENCH_REDIS (redis://127.0.0.1:PORT; skipped when unset), with 64 workers' load from other replicas
// (zero), so each decision also sums their load and hands its routed record (512 blocks) to the shared state's
// thread.
// Arg 2 = the same with that Redis unreachable (the replica routes alone; records are still queued, then
// dropped oldest-first).
void BM_RouterRouteShared(benchmark::State& state) {
  constexpr int kWorkers = 64;
  const int shared = static_cast<int>(state.range(0));
  kvroute::router::Config config;
  config.policy = "kv_cost";
  if (shared == 1) {
    const char* url = std::getenv("KVROUTE_BENCH_REDIS");
    if (!url || !*url) {
      state.SkipWithError("set KVROUTE_BENCH_REDIS=redis://127.0.0.1:PORT to a running redis-server");
      return;
    }
    config.shared_state = url;
  } else if (shared == 2) {
    config.shared_state = "redis://127.0.0.1:1";  // nothing listens there
  }
  // Each run its own keys: a run must not start by applying the previous runs' records as another replica's.
  static int runs = 0;
  config.shared_state_prefix = "kvroute-bench-" + std::to_string(::getpid()) + "-" + std::to_string(++runs);
  kvroute::backends::WorkerRegistry registry;
  kvroute::router::RouterMetrics metrics;
  kvroute::router::Router router(config, registry, policy_named("kv_cost"), metrics);
  add_workers(registry, kWorkers);
  const auto& r = parsed();
  fill_background(router.index(), kWorkers, 1'000'000, 7);
  fill_conversation(router.index(), kWorkers, r.chain);
  std::unique_ptr<kvroute::router::ReplicaSync> sync;
  if (shared) {
    sync = std::make_unique<kvroute::router::ReplicaSync>(config, registry, router, metrics);
    if (!sync->start()) std::abort();
    // The other replicas' load, summed into every worker's view on each decision. It is zero so that kv_cost
    // prices the same views as without sharing (a loaded fleet changes what it picks, and the index with it):
    // the difference between the variants is what sharing adds, not a different decision.
    std::vector<kvroute::router::Router::RemoteLoad> others(kWorkers);
    router.set_remote_load(std::move(others));
  }
  for (auto _ : state) {
    auto d = router.route(r);
    if (!d) std::abort();
    state.PauseTiming();
    router.complete(*d, kvroute::router::Outcome{true, std::nullopt});
    state.ResumeTiming();
  }
  if (sync) {
    const auto st = router.shared_state_status();
    if (st) {
      state.counters["published"] = static_cast<double>(st->published);
      state.counters["dropped"] = static_cast<double>(st->dropped);
    }
    sync->stop();
    // A run leaves its stream (thousands of 4 KB records) in Redis; a Redis grown by earlier runs would slow
    // the later ones (page faults on the Redis core), so each run takes its keys away.
    if (shared == 1) drop_keys(config.shared_state, config.shared_state_prefix);
  }
  static const char* const kLabels[] = {"no shared state", "shared state (Redis)", "shared state, Redis unreachable"};
  state.SetLabel(kLabels[shared]);
}
BENCHMARK(BM_RouterRouteShared)->ArgName("shared")->DenseRange(0, 2)->Unit(benchmark::kMicrosecond);

// ---------------------------------------------------------------------------------------------------------
// Stage by stage.

// parse_request: JSON parse, canonicalization and hashing together.
void BM_Parse(benchmark::State& state) {
  const std::string& b = body();
  for (auto _ : state) {
    auto r = kvroute::router::parse_request(kvroute::router::Endpoint::kChatCompletions, b, {}, {});
    benchmark::DoNotOptimize(r);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * b.size()));
}
BENCHMARK(BM_Parse)->Unit(benchmark::kMicrosecond);

// parse_request on a streamed request that does not ask for usage: the body forwarded upstream is rewritten.
void BM_ParseStreamRewrite(benchmark::State& state) {
  static const std::string b = chat_body(false);
  for (auto _ : state) {
    auto r = kvroute::router::parse_request(kvroute::router::Endpoint::kChatCompletions, b, {}, {});
    benchmark::DoNotOptimize(r);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * b.size()));
}
BENCHMARK(BM_ParseStreamRewrite)->Unit(benchmark::kMicrosecond);

// JSON parse alone (what parse_request cannot avoid).
void BM_JsonParse(benchmark::State& state) {
  const std::string& b = body();
  for (auto _ : state) {
    boost::system::error_code ec;
    auto v = boost::json::parse(b, ec);
    benchmark::DoNotOptimize(v);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * b.size()));
}
BENCHMARK(BM_JsonParse)->Unit(benchmark::kMicrosecond);

// The model of a passed-through request: an embeddings batch of 512 inputs, ~1 MB, with "model" last as the
// OpenAI Python client writes it; inputs of ~2 KB of text (token_ids:0) or of 256 token ids (token_ids:1).
// top_level_model's skim (full_parse:0) against the full parse and lookup it replaced (full_parse:1).
const std::string& embeddings_body(bool token_ids) {
  static const auto make = [](bool ids) {
    std::mt19937_64 rng(3);
    boost::json::array input;
    for (int i = 0; i < 512; ++i) {
      if (ids) {
        boost::json::array tokens;
        for (int t = 0; t < 256; ++t) tokens.emplace_back(rng() % 151000);
        input.emplace_back(std::move(tokens));
        continue;
      }
      std::string text;
      while (text.size() < 2000) text += "word" + std::to_string(rng() % 5000) + (rng() % 9 ? " " : "\n");
      input.emplace_back(text);
    }
    return boost::json::serialize(boost::json::object{{"input", input}, {"model", "Qwen/Qwen3-Embedding-8B"}});
  };
  static const std::string text = make(false), ids = make(true);
  return token_ids ? ids : text;
}

void BM_TopLevelModel(benchmark::State& state) {
  const std::string& b = embeddings_body(state.range(1) != 0);
  for (auto _ : state) {
    std::string model;
    if (state.range(0) == 0) {
      model = kvroute::router::top_level_model(b);
    } else {
      boost::system::error_code ec;
      const auto v = boost::json::parse(b, ec);
      const auto* m = v.as_object().if_contains("model");
      model = std::string(m->as_string());
    }
    if (model.empty()) state.SkipWithError("no model");
    benchmark::DoNotOptimize(model);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * b.size()));
}
BENCHMARK(BM_TopLevelModel)
    ->ArgNames({"full_parse", "token_ids"})
    ->ArgsProduct({{0, 1}, {0, 1}})
    ->Unit(benchmark::kMicrosecond);

// Chat canonicalization of the parsed messages.
void BM_Canonicalize(benchmark::State& state) {
  const auto doc = boost::json::parse(body());
  const auto& messages = doc.as_object().at("messages");
  for (auto _ : state) {
    auto text = kvroute::hashing::canonical_chat(messages, nullptr);
    benchmark::DoNotOptimize(text);
  }
}
BENCHMARK(BM_Canonicalize)->Unit(benchmark::kMicrosecond);

// Block-chain hashing of the canonical text (512 blocks of 64 bytes).
void BM_Hash(benchmark::State& state) {
  const auto doc = boost::json::parse(body());
  const auto text = kvroute::hashing::canonical_chat(doc.as_object().at("messages"), nullptr);
  const std::uint64_t root = kvroute::hashing::namespace_root(kModel, "");
  for (auto _ : state) {
    auto chain = kvroute::hashing::hash_text(root, *text);
    benchmark::DoNotOptimize(chain);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * text->size()));
}
BENCHMARK(BM_Hash)->Unit(benchmark::kMicrosecond);

void BM_Match(benchmark::State& state) {
  const int workers = static_cast<int>(state.range(0));
  PrefixIndex& index = decision_index(workers);
  const auto& chain = parsed().chain;
  PrefixIndex::Match m;
  for (auto _ : state) {
    index.match(chain.hashes, m);
    benchmark::DoNotOptimize(m.longest);
  }
  state.counters["matched_blocks"] = static_cast<double>(m.longest);
  state.counters["index_entries"] = static_cast<double>(index.entries());
}
BENCHMARK(BM_Match)->ArgName("workers")->Arg(16)->Arg(64)->Unit(benchmark::kMicrosecond);

void BM_Pick(benchmark::State& state) {
  const int workers = static_cast<int>(state.range(0));
  const std::string& policy_name = kPolicies[static_cast<std::size_t>(state.range(1))];
  PrefixIndex& index = decision_index(workers);
  const auto v = views(workers);
  const auto policy = policy_named(policy_name);
  const auto& r = parsed();
  PrefixIndex::Match m;
  index.match(r.chain.hashes, m);
  std::uint64_t seq = 0;
  for (auto _ : state) {
    const auto pick = policy->pick(context(r, v, m, seq++));
    benchmark::DoNotOptimize(pick);
  }
  state.SetLabel(policy_name);
}
BENCHMARK(BM_Pick)
    ->ArgNames({"workers", "policy"})
    ->ArgsProduct({{16, 64}, {0, 1, 2}})
    ->Unit(benchmark::kNanosecond);

// ---------------------------------------------------------------------------------------------------------
// The index at scale.

// Bytes per (block, worker) entry at 1M and 10M entries over 64 workers, background traffic only (the
// sharing of tenant system prompts and 1-3 copies per conversation). The timed part is one match so the
// benchmark has something to time; the counters are the result.
void BM_IndexMemory(benchmark::State& state) {
  const auto target = static_cast<std::size_t>(state.range(0));
  PrefixIndex index;
  fill_background(index, 64, target, 11);
  const auto& chain = parsed().chain;
  PrefixIndex::Match m;
  for (auto _ : state) {
    index.match(chain.hashes, m);
    benchmark::DoNotOptimize(m.longest);
  }
  const double entries = static_cast<double>(index.entries());
  state.counters["entries"] = entries;
  state.counters["distinct_blocks"] = static_cast<double>(index.distinct_blocks());
  state.counters["memory_MiB"] = static_cast<double>(index.memory_bytes()) / (1 << 20);
  state.counters["bytes_per_entry"] = static_cast<double>(index.memory_bytes()) / entries;
}
BENCHMARK(BM_IndexMemory)
    ->ArgName("entries")
    ->Arg(1'000'000)
    ->Arg(10'000'000)
    ->Iterations(1)
    ->Unit(benchmark::kMicrosecond);

// match() throughput without events or writers: chains of 512 blocks that share a tenant system prompt
// held by every worker (long block lists to walk) and then diverge into the index's background entries
// or into blocks nobody holds. Reports chains and blocks matched per second.
void BM_MatchThroughput(benchmark::State& state) {
  const auto target = static_cast<std::size_t>(state.range(0));
  static std::map<std::size_t, std::unique_ptr<PrefixIndex>> cache;
  auto& slot = cache[target];
  if (!slot) {
    slot = std::make_unique<PrefixIndex>();
    fill_background(*slot, 64, target, 23);
  }
  PrefixIndex& index = *slot;
  // Probe chains: a conversation seen before (by replaying the generator) extended with new blocks.
  std::vector<std::vector<BlockHash>> probes;
  {
    std::uint64_t s = 23;
    std::vector<std::vector<BlockHash>> systems(64);
    for (auto& sys : systems) {
      sys.resize(32 + splitmix(s) % 129);
      for (auto& h : sys) h = splitmix(s);
    }
    for (int p = 0; p < 256; ++p) {
      const auto& sys = systems[splitmix(s) % systems.size()];
      std::vector<BlockHash> chain(sys.begin(), sys.end());
      const std::size_t tail = 16 + splitmix(s) % 497;
      for (std::size_t i = 0; i < tail; ++i) chain.push_back(splitmix(s));
      const int copies = 1 + static_cast<int>(splitmix(s) % 3);
      for (int c = 0; c < copies; ++c) splitmix(s);
      std::uint64_t fresh = 0xabcdef ^ static_cast<std::uint64_t>(p);
      while (chain.size() < 512) chain.push_back(splitmix(fresh));
      chain.resize(512);
      probes.push_back(std::move(chain));
    }
  }
  PrefixIndex::Match m;
  std::size_t k = 0;
  std::uint64_t blocks = 0;
  for (auto _ : state) {
    index.match(probes[k++ % probes.size()], m);
    blocks += m.longest;
    benchmark::DoNotOptimize(m.longest);
  }
  state.counters["matches_per_s"] = benchmark::Counter(static_cast<double>(state.iterations()),
                                                       benchmark::Counter::kIsRate);
  state.counters["matched_blocks_per_s"] = benchmark::Counter(static_cast<double>(blocks),
                                                              benchmark::Counter::kIsRate);
  state.counters["entries"] = static_cast<double>(index.entries());
}
BENCHMARK(BM_MatchThroughput)
    ->ArgName("entries")
    ->Arg(1'000'000)
    ->Arg(10'000'000)
    ->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
