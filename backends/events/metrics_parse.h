// Parser of the Prometheus text exposition format (what vLLM and SGLang serve on /metrics) and extraction of
// the figures the router uses into a WorkerTelemetry (architecture section 9).
//
// Format: https://prometheus.io/docs/instrumenting/exposition_formats/ ("Text-based format"): one sample per
// line, `name{label="value",...} value [timestamp]`; lines starting with '#' are HELP/TYPE/comments; label
// values escape '\\', '"' and '\n'; values may be NaN, +Inf, -Inf. OpenMetrics' "# EOF" is accepted too.
// Parsing is pure (backends/telemetry_poller.cc does the HTTP). A malformed line is skipped and counted, never fatal.
//
//   ParsedMetrics m = parse_prometheus_text(body);
//   WorkerTelemetry t = extract_telemetry(m);
//   if (t.kv_usage) registry.set_kv_usage(w, *t.kv_usage);
//
// Names read (vLLM): vllm:num_requests_running, vllm:num_requests_waiting, vllm:kv_cache_usage_perc (older:
// vllm:gpu_cache_usage_perc; both are fractions 0..1 despite the name), vllm:prefix_cache_queries_total,
// vllm:prefix_cache_hits_total (older: vllm:gpu_prefix_cache_queries_total / _hits_total),
// vllm:cache_config_info labels block_size, num_gpu_blocks (num_cpu_blocks when set).
// (SGLang): sglang:num_running_reqs, sglang:num_queue_reqs, sglang:token_usage, sglang:cache_hit_rate.
// A worker with several series of one name (data-parallel engines, several models) reports the sum of
// running, waiting, queries, hits and blocks, and the mean of the usage and hit-rate fractions. NaN samples
// are ignored.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backends/events/telemetry.h"

namespace kvroute::events {

struct MetricSample {
  std::string name;
  std::vector<std::pair<std::string, std::string>> labels;
  double value = 0;
  std::optional<std::int64_t> timestamp_ms;

  // The value of label `key`, or nullptr.
  const std::string* label(std::string_view key) const;
};

struct ParsedMetrics {
  std::vector<MetricSample> samples;
  std::size_t malformed_lines = 0;
};

struct ParseOptions {
  std::size_t max_bytes = 8u << 20;     // input beyond this is ignored (counted as one malformed line)
  std::size_t max_samples = 200'000;
  // Only keep samples whose name starts with one of these prefixes (empty: keep all). Saves memory and time
  // on engines that expose thousands of histogram buckets.
  std::vector<std::string> name_prefixes;
};

ParsedMetrics parse_prometheus_text(std::string_view text, const ParseOptions& options = {});

WorkerTelemetry extract_telemetry(const ParsedMetrics& metrics);

// Parses only the names extract_telemetry() reads (the fast path for a poller).
WorkerTelemetry parse_worker_telemetry(std::string_view text);

}  // namespace kvroute::events
