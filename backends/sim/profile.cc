// Model/GPU profiles and KV sizing; formulas and sources in profile.h and profiles/README.md.
#include "backends/sim/profile.h"

#include "backends/sim/internal/format.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <optional>
#include <sstream>
#include <utility>

#include <boost/json.hpp>

namespace kvroute::sim {
namespace {

namespace json = boost::json;

struct BuiltinText {
  const char* name;
  const char* json;
};
constexpr BuiltinText kBuiltinModels[] = {
#include "backends/sim/builtin_models.inc"
};

// A non-negative integer field, or nullopt when absent or null. Configs write integers, but a float with an
// integral value (e.g. 4096.0) is accepted too.
std::optional<std::uint64_t> get_uint(const json::object& o, std::string_view key, std::string* error) {
  auto it = o.find(key);
  if (it == o.end() || it->value().is_null()) return std::nullopt;
  const json::value& v = it->value();
  if (auto p = v.if_int64(); p && *p >= 0) return static_cast<std::uint64_t>(*p);
  if (auto p = v.if_uint64()) return *p;
  if (auto p = v.if_double(); p && *p >= 0 && std::floor(*p) == *p) return static_cast<std::uint64_t>(*p);
  *error = "config.json: '" + std::string(key) + "' must be a non-negative integer";
  return std::nullopt;
}

std::optional<bool> get_bool(const json::object& o, std::string_view key) {
  auto it = o.find(key);
  if (it == o.end()) return std::nullopt;
  if (auto p = it->value().if_bool()) return *p;
  return std::nullopt;
}

std::string get_string(const json::object& o, std::string_view key) {
  auto it = o.find(key);
  if (it == o.end()) return {};
  if (auto p = it->value().if_string()) return std::string(p->data(), p->size());
  return {};
}

double dtype_bytes(std::string_view dtype) {
  if (dtype == "float32") return 4;
  if (dtype == "float8_e4m3fn" || dtype == "float8_e5m2" || dtype == "int8") return 1;
  return 2;  // bfloat16, float16 and the usual absence of the key
}

// Parameters of one gated MLP (gate, up, down projections: LLaMA/Qwen/DeepSeek all use SwiGLU).
double mlp_params(double hidden, double intermediate) { return 3.0 * hidden * intermediate; }

// Counts parameters from the shapes: what the GPU must hold (params) and what each token multiplies
// (compute_params: no embedding tables, only the routed experts a token visits plus the shared ones).
void estimate_params(ModelProfile& m) {
  const double h = m.hidden_size;
  double attn = 0;
  if (m.is_mla()) {
    // DeepSeek-V2/V3 MLA projections: q down/up (or a plain q projection without q_lora_rank), kv down
    // to the latent plus the rotary key, kv up to per-head nope keys and values, and the output projection.
    const double heads = m.num_attention_heads;
    const double qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
    const double q = m.q_lora_rank > 0 ? h * m.q_lora_rank + m.q_lora_rank * heads * qk : h * heads * qk;
    const double kv_down = h * (m.kv_lora_rank + m.qk_rope_head_dim);
    const double kv_up = m.kv_lora_rank * heads * (m.qk_nope_head_dim + m.v_head_dim);
    const double o = heads * m.v_head_dim * h;
    attn = q + kv_down + kv_up + o;
  } else {
    const double q = h * m.num_attention_heads * m.head_dim;
    const double kv = 2.0 * h * m.num_kv_heads * m.head_dim;
    const double o = m.num_attention_heads * m.head_dim * h;
    attn = q + kv + o;
  }
  const double dense_mlp = mlp_params(h, m.intermediate_size);
  double total_layers = 0, active_layers = 0;
  if (m.num_experts > 0) {
    const double expert = mlp_params(h, m.moe_intermediate_size);
    const double router = h * m.num_experts;
    const double dense_layers = std::min(m.first_k_dense_layers, m.num_layers);
    const double moe_layers = m.num_layers - dense_layers;
    total_layers = dense_layers * (attn + dense_mlp) +
                   moe_layers * (attn + router + expert * (m.num_experts + m.num_shared_experts));
    active_layers = dense_layers * (attn + dense_mlp) +
                    moe_layers * (attn + router + expert * (m.num_experts_per_tok + m.num_shared_experts));
  } else {
    total_layers = m.num_layers * (attn + dense_mlp);
    active_layers = total_layers;
  }
  const double embed = static_cast<double>(m.vocab_size) * h;
  m.params = total_layers + embed * (m.tie_word_embeddings ? 1 : 2);
  m.compute_params = active_layers;
}

}  // namespace

double ModelProfile::kv_bytes_per_token() const {
  if (is_mla()) return static_cast<double>(kv_lora_rank + qk_rope_head_dim) * num_layers * kv_bytes_per_value;
  return 2.0 * num_layers * num_kv_heads * head_dim * kv_bytes_per_value;
}

double ModelProfile::kv_bytes_for_sequence(double tokens) const {
  if (sliding_window == 0 || num_sliding_layers == 0) return kv_bytes_per_token() * tokens;
  const double per_layer = kv_bytes_per_token() / num_layers;
  const double full = num_layers - num_sliding_layers;
  return per_layer * (full * tokens + num_sliding_layers * std::min<double>(tokens, sliding_window));
}

double ModelProfile::attention_flops_per_pair(bool sliding) const {
  const double layers = sliding ? num_sliding_layers : num_layers - (sliding_window ? num_sliding_layers : 0);
  // Per layer and head: q.k over the key dimension and p.v over the value dimension, 2 FLOPs per MAC.
  double qk = head_dim, v = head_dim;
  if (is_mla()) {
    qk = qk_nope_head_dim + qk_rope_head_dim;
    v = v_head_dim;
  }
  return 2.0 * layers * num_attention_heads * (qk + v);
}

Result<ModelProfile> parse_model_config(std::string_view json_text, std::string_view name) {
  boost::system::error_code ec;
  json::value doc = json::parse(json::string_view(json_text.data(), json_text.size()), ec);
  if (ec) return make_error("config.json: not valid JSON (" + ec.message() + ")");
  const json::object* root = doc.if_object();
  if (!root) return make_error("config.json: expected a JSON object at the top level");
  // Multimodal configs (e.g. Llama 4, Qwen-VL) nest the language model under text_config.
  if (auto it = root->find("text_config"); it != root->end() && it->value().is_object()) {
    if (!root->contains("num_hidden_layers")) root = &it->value().get_object();
  }
  const json::object& o = *root;
  std::string err;
  auto req = [&](std::string_view key) -> std::uint32_t {
    auto v = get_uint(o, key, &err);
    if (!v && err.empty()) err = "config.json: missing '" + std::string(key) + "'";
    return v ? static_cast<std::uint32_t>(*v) : 0;
  };
  auto opt = [&](std::string_view key, std::uint32_t dflt) -> std::uint32_t {
    auto v = get_uint(o, key, &err);
    return v ? static_cast<std::uint32_t>(*v) : dflt;
  };

  ModelProfile m;
  m.num_layers = req("num_hidden_layers");
  m.hidden_size = req("hidden_size");
  m.num_attention_heads = req("num_attention_heads");
  if (!err.empty()) return make_error(err);
  if (m.num_layers == 0 || m.hidden_size == 0 || m.num_attention_heads == 0)
    return make_error("config.json: num_hidden_layers, hidden_size and num_attention_heads must be positive");
  m.num_kv_heads = opt("num_key_value_heads", m.num_attention_heads);
  m.head_dim = opt("head_dim", m.hidden_size / m.num_attention_heads);
  m.intermediate_size = opt("intermediate_size", 4 * m.hidden_size);
  m.vocab_size = opt("vocab_size", 32000);
  m.max_position_embeddings = opt("max_position_embeddings", 0);
  m.tie_word_embeddings = get_bool(o, "tie_word_embeddings").value_or(false);
  m.kv_lora_rank = opt("kv_lora_rank", 0);
  m.qk_rope_head_dim = opt("qk_rope_head_dim", 0);
  m.qk_nope_head_dim = opt("qk_nope_head_dim", 0);
  m.v_head_dim = opt("v_head_dim", m.head_dim);
  m.q_lora_rank = opt("q_lora_rank", 0);
  m.num_experts = opt("n_routed_experts", opt("num_experts", opt("num_local_experts", 0)));
  m.num_experts_per_tok = opt("num_experts_per_tok", 0);
  m.num_shared_experts = opt("n_shared_experts", 0);
  m.moe_intermediate_size = opt("moe_intermediate_size", m.intermediate_size);
  m.first_k_dense_layers = opt("first_k_dense_replace", 0);

  // Sliding window, three conventions: Gemma-style layer_types lists each layer; Qwen2/3 switch it on with
  // use_sliding_window for the layers from max_window_layers on; Mistral applies it to every layer.
  m.sliding_window = opt("sliding_window", 0);
  if (m.sliding_window > 0) {
    auto lt = o.find("layer_types");
    if (lt != o.end() && lt->value().is_array()) {
      std::uint32_t n = 0;
      for (const auto& t : lt->value().get_array())
        if (auto s = t.if_string(); s && *s == "sliding_attention") ++n;
      m.num_sliding_layers = std::min(n, m.num_layers);
    } else if (auto use = get_bool(o, "use_sliding_window"); use.has_value()) {
      const std::uint32_t first = opt("max_window_layers", m.num_layers);
      m.num_sliding_layers = *use && first < m.num_layers ? m.num_layers - first : 0;
    } else {
      m.num_sliding_layers = m.num_layers;
    }
    if (m.num_sliding_layers == 0) m.sliding_window = 0;
  }
  if (!err.empty()) return make_error(err);

  m.weight_bytes_per_param = dtype_bytes(get_string(o, "torch_dtype"));
  if (std::string d = get_string(o, "dtype"); !d.empty()) m.weight_bytes_per_param = dtype_bytes(d);
  // KV follows the activation dtype (vLLM kv_cache_dtype "auto"): 16 bits unless the model runs in fp32.
  m.kv_bytes_per_value = m.weight_bytes_per_param >= 4 ? 4 : 2;
  if (auto q = o.find("quantization_config"); q != o.end() && q->value().is_object()) {
    const json::object& qo = q->value().get_object();
    const std::string method = get_string(qo, "quant_method");
    if (method == "fp8") m.weight_bytes_per_param = 1;
    if (auto bits = get_uint(qo, "bits", &err); bits && *bits > 0) m.weight_bytes_per_param = *bits / 8.0;
    err.clear();
  }
  estimate_params(m);

  if (!name.empty()) {
    m.name = std::string(name);
  } else {
    m.name = get_string(o, "_name_or_path");
    if (m.name.empty()) m.name = get_string(*doc.if_object(), "_name_or_path");
    if (m.name.empty()) m.name = "custom";
  }
  return m;
}

Result<ModelProfile> load_model_config(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error("cannot open model config '" + path + "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  auto m = parse_model_config(ss.str());
  if (!m) return make_error(path + ": " + m.error().message);
  if (m->name == "custom") {
    std::string base = path.substr(path.find_last_of('/') + 1);
    if (base.size() > 5 && base.ends_with(".json")) base.resize(base.size() - 5);
    m->name = base;
  }
  return m;
}

Result<ModelProfile> builtin_model(std::string_view name) {
  for (const auto& b : kBuiltinModels) {
    if (name == b.name) return parse_model_config(b.json, b.name);
  }
  std::string known;
  for (const auto& b : kBuiltinModels) known += (known.empty() ? "" : ", ") + std::string(b.name);
  return make_error("unknown model profile '" + std::string(name) + "' (known: " + known +
                    "; or give a config.json)");
}

std::vector<std::string> builtin_model_names() {
  std::vector<std::string> out;
  for (const auto& b : kBuiltinModels) out.emplace_back(b.name);
  return out;
}

namespace {
// NVIDIA datasheets (H100 SXM5, H200 SXM, A100 80GB SXM4, L4); dense BF16 = half the sparsity figure.
// Memory is the marketed decimal capacity, which is what reproduces the published pool arithmetic; the device
// memory is nvidia-smi's memory.total for each board (MiB).
constexpr double kMiB = 1048576.0;
const GpuProfile kGpus[] = {
    {"h100-80gb", 80e9, 3.35e12, 989e12, 81559 * kMiB},
    {"h200-141gb", 141e9, 4.8e12, 989e12, 143771 * kMiB},
    {"a100-80gb", 80e9, 2.039e12, 312e12, 81920 * kMiB},
    {"l4", 24e9, 300e9, 121e12, 23034 * kMiB},
};
}  // namespace

Result<GpuProfile> builtin_gpu(std::string_view name) {
  for (const auto& g : kGpus) {
    if (name == g.name) return g;
  }
  std::string known;
  for (const auto& g : kGpus) known += (known.empty() ? "" : ", ") + g.name;
  return make_error("unknown GPU profile '" + std::string(name) + "' (known: " + known + ")");
}

std::vector<std::string> builtin_gpu_names() {
  std::vector<std::string> out;
  for (const auto& g : kGpus) out.push_back(g.name);
  return out;
}

std::uint64_t KvSizing::sequences_that_fit(std::uint64_t tokens) const {
  if (tokens == 0 || block_tokens == 0) return 0;
  const std::uint64_t blocks_per_seq = (tokens + block_tokens - 1) / block_tokens;
  return num_blocks / blocks_per_seq;
}

KvSizing kv_sizing(const ModelProfile& model, const GpuProfile& gpu, double gpu_memory_utilization,
                   std::uint32_t block_tokens, std::uint32_t tensor_parallel) {
  KvSizing s;
  s.block_tokens = block_tokens == 0 ? 16 : block_tokens;
  s.kv_bytes_per_token = model.kv_bytes_per_token();
  s.weight_bytes = model.weight_bytes();
  s.usable_bytes = gpu.memory_bytes * gpu_memory_utilization * std::max<std::uint32_t>(tensor_parallel, 1);
  s.pool_bytes = std::max(0.0, s.usable_bytes - s.weight_bytes);
  const double block_bytes = s.kv_bytes_per_token * s.block_tokens;
  s.num_blocks = block_bytes > 0 ? static_cast<std::uint64_t>(std::floor(s.pool_bytes / block_bytes)) : 0;
  return s;
}

namespace {
std::string fmt(const char* f, double a) { return internal::format_number(f, a); }
std::string bytes_str(double b) {
  return fmt("%.2f GB", b / 1e9) + " = " + fmt("%.1f GiB", b / 1073741824.0);
}
}  // namespace

std::string kv_size_report(const ModelProfile& model, const GpuProfile& gpu, double gpu_memory_utilization,
                           std::uint32_t block_tokens, std::uint32_t tensor_parallel) {
  const KvSizing s = kv_sizing(model, gpu, gpu_memory_utilization, block_tokens, tensor_parallel);
  std::string r;
  r += "model: " + model.name + " (" + std::to_string(model.num_layers) + " layers, ";
  if (model.is_mla())
    r += "MLA latent " + std::to_string(model.kv_lora_rank) + " + rope " + std::to_string(model.qk_rope_head_dim);
  else
    r += std::to_string(model.num_kv_heads) + " KV heads x " + std::to_string(model.head_dim);
  if (model.num_sliding_layers > 0)
    r += ", " + std::to_string(model.num_sliding_layers) + " sliding-window layers of " +
         std::to_string(model.sliding_window) + " tokens";
  r += ", " + fmt("%.0f-bit KV", model.kv_bytes_per_value * 8) + ")\n";
  r += "KV bytes per token: " + fmt("%.0f", s.kv_bytes_per_token) + " (" + fmt("%.1f KiB", s.kv_bytes_per_token / 1024) +
       ")\n";
  r += "KV per sequence:";
  for (std::uint64_t t : {8192ull, 32768ull, 131072ull})
    r += "  " + std::to_string(t / 1024) + "K " + fmt("%.2f GiB", model.kv_bytes_for_sequence(t) / 1073741824.0);
  r += "\n";
  r += "GPU: " + gpu.name + (tensor_parallel > 1 ? " x" + std::to_string(tensor_parallel) : "") + ", " +
       fmt("%.0f GB", gpu.memory_bytes / 1e9) + " each, " + fmt("%.2f", gpu_memory_utilization) + " usable: " +
       bytes_str(s.usable_bytes) + "\n";
  r += "weights: " + fmt("%.3g", model.params) + " params x " + fmt("%g", model.weight_bytes_per_param) +
       " bytes = " + bytes_str(s.weight_bytes) + "\n";
  r += "KV pool: " + bytes_str(s.pool_bytes) + " = " + std::to_string(s.num_blocks) + " blocks of " +
       std::to_string(s.block_tokens) + " tokens (" + std::to_string(s.num_blocks * s.block_tokens) + " tokens)\n";
  if (s.pool_bytes <= 0) r += "the weights do not fit: add GPUs (tensor parallelism) or quantize\n";
  r += "sequences that fit:";
  for (std::uint64_t t : {8192ull, 32768ull, 131072ull})
    r += "  " + std::to_string(t / 1024) + "K " + std::to_string(s.sequences_that_fit(t));
  r += "\n";
  return r;
}

}  // namespace kvroute::sim
