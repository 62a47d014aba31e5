// KV-event ingestion throughput (issue 4 acceptance: >= 1,000,000 block events per second on one core).
//
// Workload: a steady state of a vLLM worker under cache pressure. Each batch stores one request's chain of
// kBlocksPerChain 16-token blocks (one BlockStored, chained from the root) and evicts the chain stored
// kLive batches earlier (one BlockRemoved), so the index holds about kLive x kBlocksPerChain blocks of this
// worker. Payloads are pre-encoded; a block event is one block stored or removed, so each batch counts
// 2 x kBlocksPerChain items.
//
// Baselines beside it: hashing the same tokens alone (the XXH3 floor of keying by our own hash) and the
// PrefixIndex store/remove alone (the index floor); decode-only shows the msgpack share.
#include <benchmark/benchmark.h>

#include <map>
#include <numeric>
#include <tuple>
#include <vector>

#include "backends/events/event_applier.h"
#include "backends/events/native_events.h"
#include "backends/events/vllm_events.h"
#include "hashing/block_chain.h"
#include "hashing/prefix_index.h"

namespace {

using namespace kvroute;
using namespace kvroute::events;

constexpr int kBlocksPerChain = 32;

struct Workload {
  std::vector<std::vector<std::uint8_t>> payloads;  // vLLM msgpack
  std::vector<std::string> native;                   // protobuf
  std::vector<KvEventBatch> batches;                 // decoded
  std::vector<std::vector<std::uint32_t>> tokens;    // per chain
};

// `chains` distinct prompts; batch i stores chain i and removes chain i - live (mod chains).
Workload make_workload(int chains, int live, VllmShape shape) {
  Workload w;
  std::uint32_t tok = 1;
  for (int c = 0; c < chains; ++c) {
    std::vector<std::uint32_t> t(16 * kBlocksPerChain);
    for (auto& x : t) x = (tok = tok * 1103515245u + 12345u) % 151'000u;  // vocabulary-sized ids
    w.tokens.push_back(std::move(t));
  }
  auto hashes_of = [](int c) {
    std::vector<std::uint64_t> hs(kBlocksPerChain);
    for (int b = 0; b < kBlocksPerChain; ++b) {
      hs[b] = 0x9E3779B97F4A7C15ull * (static_cast<std::uint64_t>(c) * kBlocksPerChain + b + 1);
    }
    return hs;
  };
  for (int i = 0; i < chains; ++i) {
    KvEventBatch b;
    b.ts = 1.0 + i;
    b.data_parallel_rank = 0;
    auto hs = hashes_of(i);
    b.add_stored(hs, std::nullopt, w.tokens[i], 16);
    b.add_removed(hashes_of((i - live + chains) % chains));
    w.payloads.push_back(encode_vllm_batch(b, shape));
    w.native.push_back(encode_native_batch(b));
    w.batches.push_back(std::move(b));
  }
  return w;
}

const Workload& workload(int chains, int live, VllmShape shape) {
  static std::map<std::tuple<int, int, int>, Workload> cache;
  auto key = std::make_tuple(chains, live, static_cast<int>(shape));
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, make_workload(chains, live, shape)).first;
  return it->second;
}

void set_items(benchmark::State& state, std::int64_t batches) {
  state.SetItemsProcessed(batches * 2 * kBlocksPerChain);
}

// Decode + apply, vLLM msgpack. Args: chains, live chains, shape.
void BM_IngestVllm(benchmark::State& state) {
  const auto shape = static_cast<VllmShape>(state.range(2));
  const Workload& w = workload(static_cast<int>(state.range(0)), static_cast<int>(state.range(1)), shape);
  hashing::PrefixIndex index;
  KvEventApplier applier(index, applier_options(0, "bench-model"));
  KvEventBatch batch;
  std::size_t i = 0;
  std::int64_t n = 0;
  for (auto _ : state) {
    auto st = decode_vllm_batch(w.payloads[i], DecodeLimits{}, batch);
    if (!st) state.SkipWithError(st.error().message.c_str());
    applier.apply(batch);
    if (++i == w.payloads.size()) i = 0;
    ++n;
  }
  set_items(state, n);
  state.counters["index_blocks"] = static_cast<double>(index.worker_blocks(0));
}
BENCHMARK(BM_IngestVllm)
    ->ArgNames({"chains", "live", "shape"})
    ->Args({512, 256, 0})
    ->Args({512, 256, 2})
    ->Args({8192, 4096, 0});

void BM_IngestNative(benchmark::State& state) {
  const Workload& w = workload(static_cast<int>(state.range(0)), static_cast<int>(state.range(1)),
                               VllmShape::kArrayPositional);
  hashing::PrefixIndex index;
  KvEventApplier applier(index, applier_options(0, "bench-model"));
  NativeDecoder dec;
  KvEventBatch batch;
  std::optional<WorkerTelemetry> load;
  std::size_t i = 0;
  std::int64_t n = 0;
  for (auto _ : state) {
    const std::string& p = w.native[i];
    auto st = dec.decode({reinterpret_cast<const std::uint8_t*>(p.data()), p.size()}, DecodeLimits{}, batch, load);
    if (!st) state.SkipWithError(st.error().message.c_str());
    applier.apply(batch);
    if (++i == w.native.size()) i = 0;
    ++n;
  }
  set_items(state, n);
}
BENCHMARK(BM_IngestNative)->ArgNames({"chains", "live"})->Args({512, 256});

void BM_DecodeOnlyVllm(benchmark::State& state) {
  const Workload& w = workload(512, 256, static_cast<VllmShape>(state.range(0)));
  KvEventBatch batch;
  std::size_t i = 0;
  std::int64_t n = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(decode_vllm_batch(w.payloads[i], DecodeLimits{}, batch));
    if (++i == w.payloads.size()) i = 0;
    ++n;
  }
  set_items(state, n);
}
BENCHMARK(BM_DecodeOnlyVllm)->ArgName("shape")->Arg(0)->Arg(2);

void BM_ApplyOnly(benchmark::State& state) {
  const Workload& w = workload(512, 256, VllmShape::kArrayPositional);
  hashing::PrefixIndex index;
  KvEventApplier applier(index, applier_options(0, "bench-model"));
  std::size_t i = 0;
  std::int64_t n = 0;
  for (auto _ : state) {
    applier.apply(w.batches[i]);
    if (++i == w.batches.size()) i = 0;
    ++n;
  }
  set_items(state, n);
}
BENCHMARK(BM_ApplyOnly);

// Baseline: the XXH3 chain over the same tokens, nothing else.
void BM_BaselineHashTokens(benchmark::State& state) {
  const Workload& w = workload(512, 256, VllmShape::kArrayPositional);
  const std::uint64_t root = hashing::namespace_root("bench-model", "");
  std::size_t i = 0;
  std::int64_t n = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(hashing::hash_tokens(root, w.tokens[i]));
    if (++i == w.tokens.size()) i = 0;
    ++n;
  }
  state.SetItemsProcessed(n * kBlocksPerChain);
}
BENCHMARK(BM_BaselineHashTokens);

// Baseline: PrefixIndex store + remove of the same number of blocks, keys precomputed.
void BM_BaselineIndexStoreRemove(benchmark::State& state) {
  const Workload& w = workload(512, 256, VllmShape::kArrayPositional);
  const std::uint64_t root = hashing::namespace_root("bench-model", "");
  std::vector<std::vector<hashing::BlockHash>> keys;
  for (const auto& t : w.tokens) keys.push_back(hashing::hash_tokens(root, t).hashes);
  hashing::PrefixIndex index;
  std::size_t i = 0;
  std::int64_t n = 0;
  for (auto _ : state) {
    index.store(0, keys[i], hashing::Tier::kGpu);
    index.remove(0, keys[(i + 256) % keys.size()]);
    if (++i == keys.size()) i = 0;
    ++n;
  }
  set_items(state, n);
}
BENCHMARK(BM_BaselineIndexStoreRemove);

}  // namespace

BENCHMARK_MAIN();
