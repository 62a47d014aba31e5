#include "backends/sim/server/plan_command.h"

#include <cctype>
#include <charconv>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <string>

#include "backends/sim/plan.h"

namespace kvroute::sim {

const char* const kPlanUsage = R"(usage: kvroute-sim plan CONFIG.json|MODEL [flags]

Budgets a fleet before GPUs are bought: weights plus the KV cache of every concurrent sequence against the
usable GPU memory, a verdict, the remedies in order (shared prefix, FP8 cache, fewer KV heads or MLA, more
GPUs) with their figures, the GPUs needed, and the --worker-kv-blocks / --worker-max-seqs to give kvroute.

flags (--flag VALUE or --flag=VALUE; token counts take a K suffix, 8K = 8192):
  --gpu NAME                  h100-80gb (default), h200-141gb, a100-80gb, l4
  --context TOKENS            p95 context length of a sequence, prompt + output (default 8K)
  --concurrency N             peak sequences running at once (default 16)
  --kv-dtype D                KV cache: auto (the model's), bf16, fp16, fp8 (default auto)
  --weights-dtype D           auto (config.json), bf16, fp16, fp8, int8, int4 (default auto)
  --shared-prefix TOKENS      tokens of a prefix (system prompt) the users share, part of --context (default 0)
  --sharing-users N           users sharing one copy of that prefix (default: all of them)
  --cpu-tier-gib X            CPU memory per worker for evicted KV blocks (default 0)
  --gpus-per-worker N         tensor parallel size of a worker (default 1)
  --gpu-memory-utilization X  share of the GPU memory vLLM may use (default 0.92)
  --allowance-gib X           budget the device memory less X GiB (activations, CUDA graphs) instead of
                              --gpu-memory-utilization
)";

namespace {

std::string lower_case(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::optional<double> number(std::string_view v) {
  double d = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), d);
  if (ec != std::errc() || p != v.data() + v.size() || d < 0) return std::nullopt;
  return d;
}

// "8192", "8K" or "8k" (x 1024).
std::optional<std::uint64_t> tokens(std::string_view v) {
  double scale = 1;
  if (!v.empty() && (v.back() == 'K' || v.back() == 'k')) {
    scale = 1024;
    v.remove_suffix(1);
  }
  auto n = number(v);
  if (!n || *n * scale > 1e9 || *n * scale != static_cast<double>(static_cast<std::uint64_t>(*n * scale)))
    return std::nullopt;
  return static_cast<std::uint64_t>(*n * scale);
}

std::optional<double> dtype_bytes(std::string_view v, bool kv) {
  const std::string d = lower_case(v);
  if (d == "auto") return 0.0;
  if (d == "bf16" || d == "fp16" || d == "bfloat16" || d == "float16") return 2.0;
  if (d == "fp8" || d == "fp8_e4m3" || d == "fp8_e5m2") return 1.0;
  if (!kv && d == "int8") return 1.0;
  if (!kv && (d == "int4" || d == "fp4")) return 0.5;
  return std::nullopt;
}

using FlagSetter = std::function<std::optional<std::string>(PlanInput&, std::string_view)>;

// A whole count (tokens take a K suffix) of at least `min`.
template <class T>
FlagSetter count_flag(T PlanInput::*field, const char* what, std::uint64_t min = 0) {
  return [=](PlanInput& in, std::string_view v) -> std::optional<std::string> {
    auto t = tokens(v);
    if (!t || *t < min || *t > 1000000000) return what;
    in.*field = static_cast<T>(*t);
    return std::nullopt;
  };
}
FlagSetter size_flag(double PlanInput::*field, double scale, const char* what) {
  return [=](PlanInput& in, std::string_view v) -> std::optional<std::string> {
    auto n = number(v);
    if (!n) return what;
    in.*field = *n * scale;
    return std::nullopt;
  };
}
FlagSetter dtype_flag(double PlanInput::*field, bool kv, const char* what) {
  return [=](PlanInput& in, std::string_view v) -> std::optional<std::string> {
    auto b = dtype_bytes(v, kv);
    if (!b) return what;
    in.*field = *b;
    return std::nullopt;
  };
}

std::optional<std::string> set_flag(PlanInput& in, std::string& gpu, std::string_view name, std::string_view v) {
  constexpr double kGiB = 1073741824.0;
  static const std::map<std::string, FlagSetter, std::less<>> setters = {
      {"context", count_flag(&PlanInput::context_tokens, "a token count")},
      {"shared-prefix", count_flag(&PlanInput::shared_prefix_tokens, "a token count")},
      {"concurrency", count_flag(&PlanInput::concurrency, "a count")},
      {"sharing-users", count_flag(&PlanInput::sharing_users, "a count")},
      {"gpus-per-worker", count_flag(&PlanInput::gpus_per_worker, "a GPU count", 1)},
      {"kv-dtype", dtype_flag(&PlanInput::kv_bytes_per_value, true, "auto, bf16, fp16 or fp8")},
      {"weights-dtype", dtype_flag(&PlanInput::weight_bytes_per_param, false, "auto, bf16, fp16, fp8, int8 or int4")},
      {"cpu-tier-gib", size_flag(&PlanInput::cpu_tier_bytes, kGiB, "a size in GiB")},
      {"allowance-gib", size_flag(&PlanInput::allowance_bytes, kGiB, "a size in GiB")},
      {"gpu-memory-utilization", size_flag(&PlanInput::gpu_memory_utilization, 1, "a fraction")},
  };
  if (name == "gpu") {
    gpu = lower_case(v);
    return std::nullopt;
  }
  auto it = setters.find(name);
  if (it == setters.end()) return "unknown flag --" + std::string(name) + " (see kvroute-sim plan --help)";
  if (auto what = it->second(in, v)) return "--" + std::string(name) + ": '" + std::string(v) + "' is not " + *what;
  return std::nullopt;
}

}  // namespace

int run_plan(const std::vector<std::string_view>& args) {
  PlanInput in;
  std::string target, gpu_name(kDefaultGpu);
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string_view a = args[i];
    if (a == "--help" || a == "-h") {
      std::cout << kPlanUsage;
      return 0;
    }
    if (!a.starts_with("--")) {
      if (!target.empty()) {
        std::cerr << "plan: unexpected argument '" << a << "'\n";
        return 2;
      }
      target = std::string(a);
      continue;
    }
    a.remove_prefix(2);
    std::string_view name = a, value;
    if (auto eq = a.find('='); eq != std::string_view::npos) {
      name = a.substr(0, eq);
      value = a.substr(eq + 1);
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      std::cerr << "plan: --" << name << " needs a value\n";
      return 2;
    }
    if (auto e = set_flag(in, gpu_name, name, value)) {
      std::cerr << "plan: " << *e << "\n";
      return 2;
    }
  }
  if (target.empty()) {
    std::cerr << kPlanUsage;
    return 2;
  }
  // A path (has a '/' or ends in .json) is a config file; anything else a built-in model name.
  const bool is_file = target.find('/') != std::string::npos || target.ends_with(".json");
  auto model = is_file ? load_model_config(target) : builtin_model(lower_case(target));
  auto gpu = builtin_gpu(gpu_name);
  if (!model || !gpu) {
    std::cerr << "plan: " << (model ? "--gpu: " + gpu.error().message : model.error().message) << "\n";
    return 2;
  }
  in.model = *model;
  in.gpu = *gpu;
  auto plan = make_plan(in);
  if (!plan) {
    std::cerr << "plan: " << plan.error().message << "\n";
    return 2;
  }
  std::cout << plan_report(in, *plan);
  return 0;
}

}  // namespace kvroute::sim
