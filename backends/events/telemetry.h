// WorkerTelemetry: a worker's load and cache figures as the engine reports them, from its Prometheus
// /metrics text (metrics_parse.h) or from a native LoadReport event (native_events.h).
//
// Every field is optional: engines expose different subsets, and "not reported" must stay distinguishable
// from zero so the registry can fall back to its own estimates.
#pragma once

#include <cstdint>
#include <optional>

namespace kvroute::events {

enum class EngineKind : std::uint8_t { kUnknown, kVllm, kSglang, kNative };

struct WorkerTelemetry {
  EngineKind engine = EngineKind::kUnknown;
  std::optional<double> running;               // requests being decoded / prefilled
  std::optional<double> waiting;               // requests queued
  std::optional<double> kv_usage;              // fraction 0..1 of KV capacity in use
  std::optional<double> prefix_cache_queries;  // cumulative tokens queried (vLLM)
  std::optional<double> prefix_cache_hits;     // cumulative tokens hit (vLLM)
  std::optional<double> cache_hit_rate;        // fraction 0..1 (SGLang reports it directly)
  std::optional<std::uint64_t> num_gpu_blocks;
  std::optional<std::uint64_t> num_cpu_blocks;
  std::optional<std::uint32_t> block_size;
};

}  // namespace kvroute::events
