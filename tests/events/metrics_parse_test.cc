// Prometheus text parsing on realistic vLLM and SGLang /metrics bodies.
#include "backends/events/metrics_parse.h"

#include <gtest/gtest.h>

#include <cmath>

namespace kvroute::events {
namespace {

// Shaped like vLLM v1's /metrics (names from architecture section 9; label sets as vLLM emits them).
constexpr const char* kVllm = R"(# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 12345.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-8B"} 7.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-8B"} 2.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-8B"} 0.4375
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="Qwen/Qwen3-8B"} 1.048576e+06
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="Qwen/Qwen3-8B"} 262144.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",calculate_kv_scales="False",cpu_offload_gb="0",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",is_attention_free="False",num_cpu_blocks="None",num_gpu_blocks="27306",num_gpu_blocks_override="None",prefix_caching_hash_algo="sha256",swap_space="4",swap_space_bytes="4294967296"} 1.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="Qwen/Qwen3-8B"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="Qwen/Qwen3-8B"} 57.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="Qwen/Qwen3-8B"} 57.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="Qwen/Qwen3-8B"} 3.2189
)";

TEST(MetricsParse, RealisticVllm) {
  ParsedMetrics m = parse_prometheus_text(kVllm);
  EXPECT_EQ(m.malformed_lines, 0u);
  ASSERT_EQ(m.samples.size(), 11u);
  EXPECT_EQ(m.samples[0].name, "python_gc_objects_collected_total");
  EXPECT_EQ(*m.samples[0].label("generation"), "0");
  const MetricSample& inf_bucket = m.samples[8];
  EXPECT_EQ(*inf_bucket.label("le"), "+Inf");
  WorkerTelemetry t = extract_telemetry(m);
  EXPECT_EQ(t.engine, EngineKind::kVllm);
  EXPECT_EQ(*t.running, 7);
  EXPECT_EQ(*t.waiting, 2);
  EXPECT_DOUBLE_EQ(*t.kv_usage, 0.4375);
  EXPECT_DOUBLE_EQ(*t.prefix_cache_queries, 1048576);
  EXPECT_DOUBLE_EQ(*t.prefix_cache_hits, 262144);
  EXPECT_DOUBLE_EQ(*t.cache_hit_rate, 0.25);
  EXPECT_EQ(*t.num_gpu_blocks, 27306u);
  EXPECT_FALSE(t.num_cpu_blocks.has_value());  // "None"
  EXPECT_EQ(*t.block_size, 16u);
  // The fast path reads the same figures.
  WorkerTelemetry f = parse_worker_telemetry(kVllm);
  EXPECT_EQ(*f.running, 7);
  EXPECT_EQ(*f.num_gpu_blocks, 27306u);
}

TEST(MetricsParse, OlderVllmNamesAndDataParallelEngines) {
  const char* text =
      "vllm:num_requests_running{engine=\"0\"} 1\n"
      "vllm:num_requests_running{engine=\"1\"} 2\n"
      "vllm:gpu_cache_usage_perc{engine=\"0\"} 0.2\n"
      "vllm:gpu_cache_usage_perc{engine=\"1\"} 0.4\n"
      "vllm:gpu_prefix_cache_queries_total 10\n"
      "vllm:gpu_prefix_cache_hits_total 5\n"
      "vllm:cache_config_info{block_size=\"32\",num_gpu_blocks=\"100\",engine=\"0\"} 1\n"
      "vllm:cache_config_info{block_size=\"32\",num_gpu_blocks=\"100\",engine=\"1\"} 1\n";
  WorkerTelemetry t = parse_worker_telemetry(text);
  EXPECT_EQ(*t.running, 3);
  EXPECT_FALSE(t.waiting.has_value());
  EXPECT_DOUBLE_EQ(*t.kv_usage, 0.3);
  EXPECT_DOUBLE_EQ(*t.cache_hit_rate, 0.5);
  EXPECT_EQ(*t.num_gpu_blocks, 200u);
  EXPECT_EQ(*t.block_size, 32u);
}

TEST(MetricsParse, RealisticSglang) {
  const char* text = R"(# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 12.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.28
# HELP sglang:cache_hit_rate The prefix cache hit rate.
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.61
sglang:gen_throughput{model_name="meta-llama/Llama-3.1-8B-Instruct"} 1234.5
)";
  WorkerTelemetry t = parse_worker_telemetry(text);
  EXPECT_EQ(t.engine, EngineKind::kSglang);
  EXPECT_EQ(*t.running, 12);
  EXPECT_EQ(*t.waiting, 3);
  EXPECT_DOUBLE_EQ(*t.kv_usage, 0.28);
  EXPECT_DOUBLE_EQ(*t.cache_hit_rate, 0.61);
  EXPECT_FALSE(t.num_gpu_blocks.has_value());
}

TEST(MetricsParse, SpecialValuesTimestampsEscapesAndJunk) {
  const char* text =
      "# a comment\n"
      "\n"
      "a_metric NaN\n"
      "b_metric +Inf 1712345678000\n"
      "c_metric{path=\"C:\\\\dir\",msg=\"say \\\"hi\\\"\\nbye\"} -Inf\n"
      "d_metric{} 1e-3\r\n"
      "   e_metric   42   \n"
      "f_metric{le=\"0.5\",} 3\n"
      "broken{unterminated=\"x} 1\n"
      "no_value\n"
      "bad_value{a=\"b\"} twelve\n"
      "9starts_with_digit 1\n"
      "g_metric 1 2 3\n"
      "h_metric 2.5 1712345678.250\n"
      "# EOF\n";
  ParsedMetrics m = parse_prometheus_text(text);
  EXPECT_EQ(m.malformed_lines, 5u);
  ASSERT_EQ(m.samples.size(), 7u);
  EXPECT_TRUE(std::isnan(m.samples[0].value));
  EXPECT_TRUE(std::isinf(m.samples[1].value) && m.samples[1].value > 0);
  EXPECT_EQ(*m.samples[1].timestamp_ms, 1712345678000);
  EXPECT_EQ(*m.samples[2].label("path"), "C:\\dir");
  EXPECT_EQ(*m.samples[2].label("msg"), "say \"hi\"\nbye");
  EXPECT_TRUE(std::isinf(m.samples[2].value) && m.samples[2].value < 0);
  EXPECT_DOUBLE_EQ(m.samples[3].value, 0.001);
  EXPECT_EQ(m.samples[4].name, "e_metric");
  EXPECT_EQ(m.samples[5].labels.size(), 1u);  // trailing comma allowed
  EXPECT_EQ(*m.samples[6].timestamp_ms, 1712345678250);
}

TEST(MetricsParse, NanAndOutOfRangeValuesAreNotReported) {
  const char* text =
      "vllm:num_requests_running NaN\n"
      "vllm:num_requests_waiting -3\n"
      "vllm:kv_cache_usage_perc 7.5\n";
  WorkerTelemetry t = parse_worker_telemetry(text);
  EXPECT_EQ(t.engine, EngineKind::kVllm);
  EXPECT_FALSE(t.running.has_value());
  EXPECT_FALSE(t.waiting.has_value());
  EXPECT_FALSE(t.kv_usage.has_value());
  EXPECT_EQ(extract_telemetry(parse_prometheus_text("")).engine, EngineKind::kUnknown);
}

TEST(MetricsParse, InputIsBounded) {
  std::string big;
  for (int i = 0; i < 1000; ++i) big += "x_metric{i=\"" + std::to_string(i) + "\"} 1\n";
  ParseOptions o;
  o.max_samples = 10;
  EXPECT_EQ(parse_prometheus_text(big, o).samples.size(), 10u);
  o = ParseOptions{};
  o.max_bytes = 100;
  ParsedMetrics m = parse_prometheus_text(big, o);
  EXPECT_LE(m.samples.size(), 6u);
  EXPECT_GE(m.malformed_lines, 1u);
}

}  // namespace
}  // namespace kvroute::events
