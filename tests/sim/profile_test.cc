// Sizing checks of architecture section 8 / issue 3, and config.json parsing.
#include "backends/sim/profile.h"

#include <cmath>

#include <gtest/gtest.h>

namespace kvroute::sim {
namespace {

constexpr double kKiB = 1024.0;
constexpr double kGiB = 1073741824.0;

ModelProfile model(const char* name) {
  auto m = builtin_model(name);
  EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.error().message);
  return m.value();
}
GpuProfile gpu(const char* name) { return builtin_gpu(name).value(); }

TEST(KvSizing, BytesPerTokenMatchPublishedArithmetic) {
  EXPECT_DOUBLE_EQ(model("llama-3.1-8b").kv_bytes_per_token(), 128 * kKiB);
  EXPECT_DOUBLE_EQ(model("llama-3.1-70b").kv_bytes_per_token(), 320 * kKiB);
  EXPECT_DOUBLE_EQ(model("llama-3.1-405b").kv_bytes_per_token(), 504 * kKiB);
  EXPECT_DOUBLE_EQ(model("qwen3-8b").kv_bytes_per_token(), 144 * kKiB);
  const ModelProfile ds = model("deepseek-v3");
  EXPECT_TRUE(ds.is_mla());
  EXPECT_DOUBLE_EQ(ds.kv_bytes_per_token(), (512 + 64) * 61 * 2);  // 70,272 bytes
  EXPECT_NEAR(ds.kv_bytes_per_token() / kKiB, 68.6, 0.05);
}

TEST(KvSizing, ParameterEstimatesMatchModelCards) {
  EXPECT_NEAR(model("llama-3.1-8b").params / 1e9, 8.03, 0.01);
  EXPECT_NEAR(model("llama-3.1-70b").params / 1e9, 70.6, 0.1);
  EXPECT_NEAR(model("llama-3.1-405b").params / 1e9, 405.9, 0.5);
  EXPECT_NEAR(model("qwen3-8b").params / 1e9, 8.19, 0.01);
  const ModelProfile ds = model("deepseek-v3");
  EXPECT_NEAR(ds.params / 1e9, 671, 3);
  EXPECT_NEAR(ds.compute_params / 1e9, 37, 2);  // active parameters without the embedding tables
  EXPECT_DOUBLE_EQ(ds.weight_bytes_per_param, 1);  // fp8 quantization_config
  EXPECT_DOUBLE_EQ(ds.kv_bytes_per_value, 2);
}

TEST(KvSizing, PoolOnH100AndH200) {
  const ModelProfile m = model("llama-3.1-8b");
  const KvSizing h100 = kv_sizing(m, gpu("h100-80gb"));
  EXPECT_NEAR(h100.pool_bytes / kGiB, 53.6, 0.05);
  EXPECT_EQ(h100.sequences_that_fit(8192), 53u);
  const KvSizing h200 = kv_sizing(m, gpu("h200-141gb"));
  EXPECT_NEAR(h200.pool_bytes / kGiB, 105.9, 0.05);
  EXPECT_EQ(h200.sequences_that_fit(8192), 105u);
  // Weights: 8.03e9 x 2 bytes, the "16.1 GB" of the decode bound.
  EXPECT_NEAR(h100.weight_bytes / 1e9, 16.1, 0.05);
}

TEST(KvSizing, TensorParallelAndOversizedModels) {
  const ModelProfile m = model("llama-3.1-405b");
  EXPECT_EQ(kv_sizing(m, gpu("h100-80gb")).pool_bytes, 0);  // 812 GB of weights on one GPU
  EXPECT_EQ(kv_sizing(m, gpu("h100-80gb")).num_blocks, 0u);
  EXPECT_EQ(kv_sizing(m, gpu("h100-80gb"), 0.92, 16, 8).pool_bytes, 0);  // 588.8 GB usable < 811.8 GB
  EXPECT_GT(kv_sizing(m, gpu("h200-141gb"), 0.92, 16, 8).pool_bytes, 0);
}

TEST(KvSizing, ReportHasTheNumbersAnOperatorNeeds) {
  const std::string r = kv_size_report(model("llama-3.1-8b"), gpu("h100-80gb"));
  EXPECT_NE(r.find("131072 (128.0 KiB)"), std::string::npos) << r;
  EXPECT_NE(r.find("8K 1.00 GiB"), std::string::npos) << r;
  EXPECT_NE(r.find("32K 4.00 GiB"), std::string::npos) << r;
  EXPECT_NE(r.find("128K 16.00 GiB"), std::string::npos) << r;
  EXPECT_NE(r.find("53.6 GiB"), std::string::npos) << r;
  EXPECT_NE(r.find("8K 53"), std::string::npos) << r;
  const std::string h200 = kv_size_report(model("llama-3.1-8b"), gpu("h200-141gb"));
  EXPECT_NE(h200.find("105.9 GiB"), std::string::npos) << h200;
  EXPECT_NE(h200.find("8K 105"), std::string::npos) << h200;
  const std::string ds = kv_size_report(model("deepseek-v3"), gpu("h200-141gb"), 0.92, 16, 8);
  EXPECT_NE(ds.find("68.6 KiB"), std::string::npos) << ds;
  EXPECT_NE(ds.find("MLA"), std::string::npos) << ds;
}

TEST(ModelConfig, DefaultsAndErrors) {
  // head_dim from hidden / heads, MHA when num_key_value_heads is absent.
  auto m = parse_model_config(R"({"num_hidden_layers": 2, "hidden_size": 512, "num_attention_heads": 8})", "tiny");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->name, "tiny");
  EXPECT_EQ(m->head_dim, 64u);
  EXPECT_EQ(m->num_kv_heads, 8u);
  EXPECT_DOUBLE_EQ(m->kv_bytes_per_token(), 2.0 * 2 * 8 * 64 * 2);

  auto missing = parse_model_config(R"({"hidden_size": 512, "num_attention_heads": 8})");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("num_hidden_layers"), std::string::npos);
  EXPECT_FALSE(parse_model_config("{not json").ok());
  EXPECT_FALSE(parse_model_config("[1, 2]").ok());
  auto bad = parse_model_config(R"({"num_hidden_layers": "32", "hidden_size": 512, "num_attention_heads": 8})");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("num_hidden_layers"), std::string::npos);
  EXPECT_FALSE(builtin_model("gpt-5").ok());
  EXPECT_NE(builtin_gpu("tpu").error().message.find("h100-80gb"), std::string::npos);
  EXPECT_FALSE(load_model_config("/nonexistent/config.json").ok());
}

TEST(ModelConfig, SlidingWindowConventions) {
  // Mistral: every layer slides.
  auto mistral = parse_model_config(
      R"({"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
          "sliding_window": 4096})");
  ASSERT_TRUE(mistral.ok());
  EXPECT_EQ(mistral->num_sliding_layers, 32u);
  EXPECT_DOUBLE_EQ(mistral->kv_bytes_for_sequence(32768), mistral->kv_bytes_per_token() * 4096);
  EXPECT_DOUBLE_EQ(mistral->kv_bytes_for_sequence(1000), mistral->kv_bytes_per_token() * 1000);
  // Qwen2/3: off unless use_sliding_window; then layers from max_window_layers on.
  auto qwen = parse_model_config(
      R"({"num_hidden_layers": 36, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
          "sliding_window": 4096, "use_sliding_window": true, "max_window_layers": 28})");
  ASSERT_TRUE(qwen.ok());
  EXPECT_EQ(qwen->num_sliding_layers, 8u);
  EXPECT_EQ(model("qwen3-8b").num_sliding_layers, 0u);
  // Gemma-style layer_types.
  auto gemma = parse_model_config(
      R"({"num_hidden_layers": 4, "hidden_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 4,
          "head_dim": 256, "sliding_window": 512,
          "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"]})");
  ASSERT_TRUE(gemma.ok());
  EXPECT_EQ(gemma->num_sliding_layers, 3u);
  const double per_layer = gemma->kv_bytes_per_token() / 4;
  EXPECT_DOUBLE_EQ(gemma->kv_bytes_for_sequence(2048), per_layer * (2048 + 3 * 512));
}

TEST(ModelConfig, BuiltinNames) {
  EXPECT_EQ(builtin_model_names().size(), 5u);
  for (const auto& n : builtin_model_names()) EXPECT_TRUE(builtin_model(n).ok()) << n;
  for (const auto& n : builtin_gpu_names()) EXPECT_TRUE(builtin_gpu(n).ok()) << n;
  EXPECT_EQ(model("qwen3-8b").name, "qwen3-8b");
}

}  // namespace
}  // namespace kvroute::sim
