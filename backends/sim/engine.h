// Engine: the simulated vLLM worker engine (architecture section 8), driven by a clock it is given.
//
// The engine owns a paged KV cache with prefix caching (16-token blocks keyed by chained block hashes,
// reference counts, an LRU queue of freed blocks in which a finished request's tail blocks go first, an
// optional CPU tier) and a continuous-batching scheduler (waiting queue, running set, a token budget per
// step with chunked prefill, a cap on running sequences, preemption by recompute). Each step's duration
// comes from a roofline model: max(compute, memory traffic) + a fixed step overhead.
//
// It does no I/O, starts no threads and never reads a clock: every call takes `now` (seconds on any
// monotonic timeline the caller chooses), so the same code runs an HTTP worker in real time and a fleet
// simulator in virtual time. Same calls with same arguments, same callbacks: the engine is deterministic.
//
// Contract:
//  * submit() queues a request; it enters the scheduler after the front-end delay (tokenization, HTTP,
//    detokenization: frontend_overhead_s + prompt_tokens x frontend_s_per_prompt_token).
//  * next_event_time() is when the engine next needs advance(): the end of the step in flight, a request
//    becoming ready, a CPU-tier load finishing; +infinity when idle.
//  * advance(now, sink) runs everything that happens at or before `now`: steps start when the previous one
//    ends (or when work arrives on an idle engine) and their effects (tokens, finishes, cache changes) are
//    reported through the sink with their own timestamps, which are <= now and non-decreasing.
//  * Cache changes happen only inside advance() and are all reported: applying on_blocks_stored /
//    on_blocks_removed / on_all_cleared per medium reproduces cached_block_hashes() exactly after every call.
//  * Not thread-safe; one owner calls everything (a strand in the HTTP worker, the event loop of a simulator).
//    Sink callbacks must not call back into the engine; queue the follow-up and make it after advance().
//
//   Engine engine(EngineConfig::defaults());               // qwen3-8b on h100-80gb
//   engine.submit({.id = 1, .block_hashes = chain.hashes, .prompt_tokens = 16384, .max_tokens = 64}, now);
//   while (engine.next_event_time() < kInfinity) {
//     double t = engine.next_event_time();                  // virtual time: jump; real time: sleep until t
//     engine.advance(t, sink);                              // sink.on_first_token(1, t, cached, 16384) ...
//   }
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backends/sim/profile.h"
#include "util/result.h"

namespace kvroute::sim {

inline constexpr double kInfinity = std::numeric_limits<double>::infinity();

enum class Medium : std::uint8_t { kGpu = 0, kCpu = 1 };
inline const char* medium_name(Medium m) { return m == Medium::kGpu ? "GPU" : "CPU"; }

enum class PrefixCommit : std::uint8_t { kStepEnd, kSchedule };
// "step-end" or "schedule"; the error names both.
Result<PrefixCommit> parse_prefix_commit(std::string_view name);

struct EngineConfig {
  ModelProfile model;
  GpuProfile gpu;
  double gpu_memory_utilization = 0.92;  // vLLM's --gpu-memory-utilization default is 0.9; the brief uses 0.92
  std::uint32_t tensor_parallel = 1;     // GPUs per worker: memory, bandwidth and FLOP/s scale with it
  std::uint32_t block_tokens = 16;       // vLLM's default block size
  std::uint32_t max_num_seqs = 256;      // vLLM --max-num-seqs default
  std::uint32_t max_batched_tokens = 8192;  // chunked-prefill token budget per step (--max-num-batched-tokens)
  std::optional<std::uint64_t> num_gpu_blocks;  // overrides the sizing formula (like --num-gpu-blocks-override)
  // When the blocks a step computes become prefix-cache hits for other sequences. kStepEnd: once the step has
  // run (SGLang inserts a prefill chunk into its radix tree after the chunk's forward pass; only its non-default
  // LPM schedule holds back a waiting request whose prefix another waiting one will compute). kSchedule: as soon
  // as the step is scheduled (vLLM v1's KVCacheManager.allocate_slots caches the full blocks of the tokens it
  // schedules, before the forward pass), so a sequence admitted later in the same step already hits them.
  PrefixCommit prefix_commit = PrefixCommit::kStepEnd;

  // CPU tier (KV offloading): 0 bytes disables it. Evicted GPU blocks are copied here; a prefix found here
  // is loaded back over a link of cpu_transfer_bytes_per_s before the request computes the rest.
  double cpu_tier_bytes = 0;
  double cpu_transfer_bytes_per_s = 0;  // 0 = the calibrated default (see engine.cc)

  // Roofline and overhead constants; negative = the calibrated default for Qwen3-8B / H100 (see engine.cc
  // and bench/sim_calibration.cc, which prints the fit against the measurements of architecture section 1).
  double linear_mfu = -1;           // fraction of peak reached by the weight matmuls of prefill
  double attention_mfu = -1;        // fraction of peak reached by attention over the context
  double step_overhead_s = -1;      // scheduling, sampling, launch: paid by every step
  double frontend_overhead_s = -1;  // per request, outside the GPU: HTTP, chat template, detokenize
  double frontend_s_per_prompt_token = -1;  // per prompt token, outside the GPU: tokenization, hashing

  // Qwen3-8B on an H100 80 GB with every constant at its calibrated default.
  static EngineConfig defaults();
  // Named profiles; errors name the unknown profile and list the known ones.
  static Result<EngineConfig> make(std::string_view model, std::string_view gpu);
};

// One request as the engine sees it: block hashes, not token ids, so a long trace stays cheap. Callers that
// have tokens compute the chain with kvroute::hashing::hash_tokens (one hash per FULL block of block_tokens).
struct SimRequest {
  std::uint64_t id = 0;  // unique among the requests the engine holds
  // Chained hashes of the full blocks of the prompt. It may continue past the prompt over the tokens the
  // request will generate (prompt + output), in which case those blocks are cached as decoding fills them,
  // as vLLM does; otherwise only prompt blocks are cached. Blocks beyond prompt_tokens + max_tokens are ignored.
  std::vector<std::uint64_t> block_hashes;
  std::uint32_t prompt_tokens = 0;  // >= 16 x (prompt blocks); the partial tail block is computed, never cached
  std::uint32_t max_tokens = 1;     // tokens to generate (a simulated worker always generates all of them)
};

struct Accepted {
  double ready_time = 0;  // when the request reaches the scheduler (after the front-end delay)
};

struct Usage {
  std::uint32_t prompt_tokens = 0;
  std::uint32_t completion_tokens = 0;
  std::uint32_t cached_tokens = 0;  // prompt tokens served from the cache (GPU + CPU tier) at first schedule
};

// Receives what the engine does. Every method has an empty default so a consumer overrides what it needs.
// Timestamps are engine time (the caller's clock). Spans are valid only during the call.
class EngineSink {
 public:
  virtual ~EngineSink() = default;
  // The first token is ready: called once per request, just before on_token(id, t, 0).
  // cached_tokens: prompt tokens served from the cache, GPU + CPU tier (usage.prompt_tokens_details).
  virtual void on_first_token(std::uint64_t id, double t, std::uint32_t cached_tokens, std::uint32_t prompt_tokens) {}
  // Token `index` (0-based, 0 = first) of the request's output is ready.
  virtual void on_token(std::uint64_t id, double t, std::uint32_t index) {}
  // The request generated its max_tokens and left the engine (after its last on_token).
  virtual void on_finish(std::uint64_t id, double t, const Usage& usage) {}

  // KV events, in vLLM's vocabulary (architecture section 9). `hashes` is a run of consecutive blocks of one
  // chain; `parent` is the hash of the block before the first (nullopt at the root of the chain).
  // request_id / first_block_index say where the blocks came from: the request that computed (or loaded)
  // them and the index of hashes[0] in that request's block_hashes. For blocks copied to the CPU tier on
  // eviction it is the request that originally computed them, which may have finished long ago; a consumer
  // that needs the token ids of a block (vLLM's BlockStored carries them) keeps them until the block is
  // removed from every medium.
  virtual void on_blocks_stored(std::span<const std::uint64_t> hashes, std::optional<std::uint64_t> parent,
                                std::uint64_t request_id, std::uint32_t first_block_index, Medium medium,
                                double t) {}
  virtual void on_blocks_removed(std::span<const std::uint64_t> hashes, Medium medium, double t) {}
  virtual void on_all_cleared(double t) {}
};

struct EngineStats {
  std::uint32_t running = 0;        // admitted sequences (including those loading from the CPU tier)
  std::uint32_t waiting = 0;        // queued for admission, including requests still in the front end
  double kv_usage = 0;              // fraction of GPU blocks in use (cached-but-free blocks count as free)
  std::uint64_t num_gpu_blocks = 0;
  std::uint64_t num_cpu_blocks = 0;
  std::uint32_t block_tokens = 16;
  std::uint64_t gpu_cached_blocks = 0;  // blocks with a hash on GPU (in use or free)
  std::uint64_t cpu_cached_blocks = 0;
  // Counters since construction (Prometheus counters).
  std::uint64_t prefix_cache_queries = 0;  // prompt tokens looked up at admission (vllm:prefix_cache_queries)
  std::uint64_t prefix_cache_hits = 0;     // of those, found on GPU (vllm:prefix_cache_hits)
  std::uint64_t cpu_cache_hits = 0;        // of those, found on the CPU tier (loaded back)
  std::uint64_t prompt_tokens_computed = 0;
  std::uint64_t generation_tokens = 0;
  std::uint64_t preemptions = 0;
  std::uint64_t gpu_evictions = 0;  // cached GPU blocks whose hash was dropped to reuse the block
  std::uint64_t cpu_evictions = 0;  // blocks dropped from the CPU tier for lack of room
  std::uint64_t requests_finished = 0;
  std::uint64_t requests_cancelled = 0;
  std::uint64_t steps = 0;
  double busy_seconds = 0;  // sum of step durations
};

namespace internal {
class EngineImpl;
}

class Engine {
 public:
  explicit Engine(EngineConfig config);
  ~Engine();
  Engine(Engine&&) noexcept;
  Engine& operator=(Engine&&) noexcept;
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request at time `now`. Errors: duplicate id, no prompt tokens, more block hashes than tokens,
  // or a request whose prompt + max_tokens - 1 tokens could never fit in the KV pool (the
  // message gives both sizes).
  Result<Accepted> submit(SimRequest request, double now);
  // Removes a request wherever it is (front end, waiting, running) and frees its blocks; no callback follows.
  // Returns false if the id is unknown (finished or never submitted).
  bool cancel(std::uint64_t id, double now);

  double next_event_time() const;
  void advance(double now, EngineSink& sink);

  // Drops every cached block (vLLM's /reset_prefix_cache) and reports on_all_cleared. Like vLLM it refuses
  // (returns false) while any block is in use by a request.
  bool reset_prefix_cache(double now, EngineSink& sink);

  EngineStats stats() const;
  // Hashes the engine holds on a medium, sorted ascending (for the debug endpoint and tests).
  std::vector<std::uint64_t> cached_block_hashes(Medium medium) const;
  // The config with every default resolved (calibrated constants filled in, block counts computed).
  const EngineConfig& config() const;
  // Predicted time of one step with the given shape; exposed for calibration and the router's cost model.
  // prefill: (new tokens, context tokens before them) per sequence; decode_context: context per decode seq.
  double step_time(std::span<const std::pair<std::uint32_t, std::uint32_t>> prefill,
                   std::span<const std::uint32_t> decode_context) const;

 private:
  std::unique_ptr<internal::EngineImpl> impl_;
};

}  // namespace kvroute::sim
