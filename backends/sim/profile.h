// Model and GPU profiles of the simulated worker, and the KV sizing arithmetic (architecture section 8).
//
// A ModelProfile is read from a Hugging Face config.json (the same file a vLLM deployment ships with) or
// looked up by name among the built-in profiles; a GpuProfile comes from a small built-in table of
// datasheet figures. kv_sizing() turns the pair into the numbers an operator sizes a fleet with: KV bytes
// per token, the KV pool left after the weights, and how many sequences of a given length fit.
//
//   Result<ModelProfile> m = load_model_config("config.json");   // or builtin_model("qwen3-8b")
//   Result<GpuProfile> g = builtin_gpu("h100-80gb");
//   KvSizing s = kv_sizing(*m, *g);          // s.kv_bytes_per_token, s.pool_bytes, s.num_blocks
//   std::cout << kv_size_report(*m, *g);     // what `kvroute-sim kv-size CONFIG.json` prints
//
// Units: bytes are plain bytes; "GB" in names and datasheets means 1e9 bytes, "GiB" 2^30 bytes. The
// published pool figures (53.6 GiB for Llama 3.1 8B on an "80 GB" H100, 105.9 GiB on a "141 GB" H200) are
// reproduced with memory = 80e9 / 141e9 bytes and weights = 8.03e9 params x 2 bytes; reading "80 GB" as
// 80 GiB would give 58.6 GiB instead. See backends/sim/profiles/README.md for every source.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "util/result.h"

namespace kvroute::sim {

struct ModelProfile {
  std::string name;  // e.g. "qwen3-8b"; from the lookup key, the file's _name_or_path, or the caller
  std::uint32_t num_layers = 0;
  std::uint32_t hidden_size = 0;
  std::uint32_t num_attention_heads = 0;
  std::uint32_t num_kv_heads = 0;      // num_key_value_heads; = num_attention_heads when absent (MHA)
  std::uint32_t head_dim = 0;          // hidden_size / num_attention_heads unless the config gives it
  std::uint32_t intermediate_size = 0;
  std::uint32_t vocab_size = 0;
  bool tie_word_embeddings = false;
  std::uint32_t max_position_embeddings = 0;

  // Multi-head latent attention (DeepSeek-V2/V3): a compressed latent of kv_lora_rank values plus a shared
  // rotary key of qk_rope_head_dim values is cached per token and layer, instead of K and V per head.
  std::uint32_t kv_lora_rank = 0;  // 0: not MLA
  std::uint32_t qk_rope_head_dim = 0;
  std::uint32_t qk_nope_head_dim = 0;
  std::uint32_t v_head_dim = 0;
  std::uint32_t q_lora_rank = 0;

  // Sliding-window attention: num_sliding_layers of the layers keep at most sliding_window tokens.
  std::uint32_t sliding_window = 0;  // 0: none
  std::uint32_t num_sliding_layers = 0;

  // Mixture of experts (0 experts: dense). Used only to count parameters.
  std::uint32_t num_experts = 0;
  std::uint32_t num_experts_per_tok = 0;
  std::uint32_t num_shared_experts = 0;
  std::uint32_t moe_intermediate_size = 0;
  std::uint32_t first_k_dense_layers = 0;

  // Parameter counts, estimated from the shapes above by parse_model_config (or set by hand).
  double params = 0;          // all weights (what the GPU must hold)
  double compute_params = 0;  // weights multiplied per token: no embedding tables, only active experts
  double weight_bytes_per_param = 2;  // torch_dtype, or the quantization_config (fp8: 1, 4-bit: 0.5)
  double kv_bytes_per_value = 2;      // vLLM's kv_cache_dtype "auto" follows the model dtype

  // KV bytes one token adds to a full-attention-only context (section 8):
  //   standard: 2 x layers x kv_heads x head_dim x bytes;   MLA: (kv_lora_rank + qk_rope_head_dim) x layers x bytes.
  // Sliding-window layers count here too (a token does occupy them until it leaves the window).
  double kv_bytes_per_token() const;
  // KV bytes of one sequence of `tokens` tokens: sliding-window layers hold at most sliding_window tokens.
  double kv_bytes_for_sequence(double tokens) const;
  double weight_bytes() const { return params * weight_bytes_per_param; }
  // Attention FLOPs per (query token, context token) pair, summed over the layers of one kind:
  // QK^T and PV are 2 multiply-adds per head per dimension.
  double attention_flops_per_pair(bool sliding_layers) const;
  bool is_mla() const { return kv_lora_rank > 0; }
};

// Parses the text of a Hugging Face config.json. `name` overrides the model name. Unknown keys are ignored;
// missing essentials (layers, hidden size, heads) are an error naming the key.
Result<ModelProfile> parse_model_config(std::string_view json_text, std::string_view name = {});
// Reads and parses a config.json file; the name defaults to its _name_or_path, else the file name.
Result<ModelProfile> load_model_config(const std::string& path);

// Built-in profiles, compiled from backends/sim/profiles/*.json so nothing depends on files at run time:
// "llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "qwen3-8b" (the default), "deepseek-v3" (MLA).
Result<ModelProfile> builtin_model(std::string_view name);
std::vector<std::string> builtin_model_names();
inline constexpr std::string_view kDefaultModel = "qwen3-8b";

struct GpuProfile {
  std::string name;
  double memory_bytes = 0;            // HBM capacity as marketed, decimal bytes (see header comment)
  double bandwidth_bytes_per_s = 0;   // HBM bandwidth
  double peak_flops = 0;              // dense BF16 tensor-core FLOP/s (without sparsity)
  // Memory the device reports (nvidia-smi memory.total, cudaMemGetInfo), which budgets that subtract a fixed
  // allowance start from: an H100 80GB reports 81,559 MiB. 0: use memory_bytes.
  double device_memory_bytes = 0;
};

// "h100-80gb" (the default, SXM), "h200-141gb", "a100-80gb" (SXM), "l4".
Result<GpuProfile> builtin_gpu(std::string_view name);
std::vector<std::string> builtin_gpu_names();
inline constexpr std::string_view kDefaultGpu = "h100-80gb";

// The sizing arithmetic for one model on one (group of) GPU(s).
struct KvSizing {
  double kv_bytes_per_token = 0;
  double weight_bytes = 0;
  double usable_bytes = 0;     // memory x gpu_memory_utilization x tensor_parallel
  double pool_bytes = 0;       // usable - weights, at least 0
  std::uint64_t num_blocks = 0;  // floor(pool / (block_tokens x kv bytes per token))
  std::uint32_t block_tokens = 16;
  // Sequences of `tokens` tokens that fit in the pool at once (whole blocks per sequence).
  std::uint64_t sequences_that_fit(std::uint64_t tokens) const;
};
KvSizing kv_sizing(const ModelProfile& model, const GpuProfile& gpu, double gpu_memory_utilization = 0.92,
                   std::uint32_t block_tokens = 16, std::uint32_t tensor_parallel = 1);

// Human-readable report: bytes per token, per sequence at 8K / 32K / 128K, weights, KV pool, blocks, and
// the sequences that fit at each length. Printed by `kvroute-sim kv-size CONFIG.json [--gpu NAME]`.
std::string kv_size_report(const ModelProfile& model, const GpuProfile& gpu, double gpu_memory_utilization = 0.92,
                           std::uint32_t block_tokens = 16, std::uint32_t tensor_parallel = 1);

}  // namespace kvroute::sim
