// The capacity planner; the arithmetic and its sources are in plan.h and profile.h.
#include "backends/sim/plan.h"

#include "backends/sim/internal/format.h"

#include <algorithm>
#include <cmath>
#include <optional>

namespace kvroute::sim {
namespace {

constexpr double kGiB = 1073741824.0;
// DeepSeek-V3's multi-head latent attention caches a 512-value latent plus a 64-value rotary key per layer
// (its config.json: kv_lora_rank 512, qk_rope_head_dim 64); remedy 3 prices that shape at the model's depth.
constexpr std::uint32_t kMlaLatent = 512;
constexpr std::uint32_t kMlaRope = 64;
// Tensor parallelism is tried up to one 8-GPU node.
constexpr std::uint32_t kMaxGpusPerWorker = 8;

// One configuration of the model and the traffic: bytes per token and how sequences share a prefix.
struct Shape {
  ModelProfile model;  // with the dtypes of this configuration
  double context = 0;  // tokens per sequence, rounded up to whole blocks
  double prefix = 0;   // shared tokens per group (0: no sharing)
  double users = 0;    // sequences per group sharing one prefix copy (0: all of them)
  double bytes_per_token = 0;

  double groups(double sequences) const {
    if (prefix <= 0 || sequences <= 0) return 0;
    return users > 0 ? std::ceil(sequences / users) : 1;
  }
  double tokens(double sequences) const { return sequences * (context - prefix) + groups(sequences) * prefix; }
  double kv_bytes(double sequences) const { return tokens(sequences) * bytes_per_token; }
};

double kv_value_bytes(const PlanInput& in) {
  return in.kv_bytes_per_value > 0 ? in.kv_bytes_per_value : in.model.kv_bytes_per_value;
}

double usable_bytes(const PlanInput& in, std::uint32_t gpus) {
  if (in.allowance_bytes > 0) {
    const double device = in.gpu.device_memory_bytes > 0 ? in.gpu.device_memory_bytes : in.gpu.memory_bytes;
    return std::max(0.0, device - in.allowance_bytes) * gpus;
  }
  return in.gpu.memory_bytes * in.gpu_memory_utilization * gpus;
}

// The most sequences whose KV fits `room` bytes (binary search: kv_bytes grows with the count).
std::uint64_t sequences_in(const Shape& s, double room) {
  if (s.bytes_per_token <= 0 || s.kv_bytes(1) > room) return 0;
  std::uint64_t lo = 1, hi = 2;
  while (hi < (1ull << 40) && s.kv_bytes(static_cast<double>(hi)) <= room) hi *= 2;
  while (hi - lo > 1) {
    const std::uint64_t mid = lo + (hi - lo) / 2;
    (s.kv_bytes(static_cast<double>(mid)) <= room ? lo : hi) = mid;
  }
  return lo;
}

PlanStep evaluate(const PlanInput& in, const Shape& s, std::string name) {
  PlanStep p;
  p.name = std::move(name);
  p.kv_bytes_per_token = s.bytes_per_token;
  p.kv_bytes_per_sequence = s.bytes_per_token * s.context;
  p.tokens_total = s.tokens(in.concurrency);
  p.kv_bytes_total = s.kv_bytes(in.concurrency);
  p.weight_bytes = s.model.weight_bytes();
  const std::uint32_t tp = std::max<std::uint32_t>(in.gpus_per_worker, 1);
  p.fits = p.weight_bytes + p.kv_bytes_total <= usable_bytes(in, tp);
  p.sequences_on_given = sequences_in(s, usable_bytes(in, tp) - p.weight_bytes);
  // The worker size (tensor parallel: the given one, doubled up to a node) that holds the peak concurrency on
  // the fewest GPUs in all; on a tie the smaller worker (less tensor-parallel overhead, finer failure unit).
  std::uint32_t gpus = tp;
  std::uint64_t best_total = 0;
  for (std::uint32_t g = tp; g <= std::max(tp, kMaxGpusPerWorker); g *= 2) {
    const std::uint64_t seqs = sequences_in(s, usable_bytes(in, g) - p.weight_bytes);
    if (seqs == 0) continue;
    const std::uint64_t total = (in.concurrency + seqs - 1) / seqs * g;
    if (best_total == 0 || total < best_total) {
      best_total = total;
      gpus = g;
    }
  }
  p.gpus_per_worker = gpus;
  p.usable_bytes = usable_bytes(in, gpus);
  p.kv_room_bytes = std::max(0.0, p.usable_bytes - p.weight_bytes);
  p.sequences_per_worker = sequences_in(s, p.kv_room_bytes);
  const double block_bytes = s.model.kv_bytes_per_token() * in.block_tokens;
  p.kv_blocks_per_worker = block_bytes > 0 ? static_cast<std::uint64_t>(std::floor(p.kv_room_bytes / block_bytes)) : 0;
  if (p.sequences_per_worker > 0) {
    p.workers = static_cast<std::uint32_t>((in.concurrency + p.sequences_per_worker - 1) / p.sequences_per_worker);
    p.gpus = p.workers * gpus;
  }
  return p;
}

Shape make_shape(const PlanInput& in, double kv_bytes_per_value, bool shared) {
  Shape s;
  s.model = in.model;
  if (in.weight_bytes_per_param > 0) s.model.weight_bytes_per_param = in.weight_bytes_per_param;
  s.model.kv_bytes_per_value = kv_bytes_per_value;
  const double block = in.block_tokens;
  s.context = std::ceil(static_cast<double>(in.context_tokens) / block) * block;
  s.bytes_per_token = s.model.kv_bytes_for_sequence(s.context) / s.context;
  if (shared) {
    s.prefix = static_cast<double>(in.shared_prefix_tokens);
    s.users = in.sharing_users;
  }
  return s;
}

std::optional<std::string> check(const PlanInput& in) {
  auto dtype_ok = [](double b) { return b == 0 || b == 0.5 || b == 1 || b == 2 || b == 4; };
  if (in.context_tokens == 0) return "the context length must be positive";
  if (in.concurrency == 0) return "the peak concurrency must be positive";
  if (in.shared_prefix_tokens >= in.context_tokens && in.shared_prefix_tokens > 0)
    return "the shared prefix (" + std::to_string(in.shared_prefix_tokens) +
           " tokens) must be shorter than the context it is part of (" + std::to_string(in.context_tokens) + ")";
  if (!dtype_ok(in.kv_bytes_per_value) || in.kv_bytes_per_value == 0.5)
    return "the KV cache holds 16-bit or FP8 values (2 or 1 bytes)";
  if (!dtype_ok(in.weight_bytes_per_param)) return "weights are 32-, 16-, 8- or 4-bit (4, 2, 1 or 0.5 bytes)";
  if (in.gpu_memory_utilization <= 0 || in.gpu_memory_utilization > 1)
    return "the GPU memory utilization must be in (0, 1]";
  if (in.allowance_bytes < 0 || in.cpu_tier_bytes < 0) return "sizes cannot be negative";
  if (in.block_tokens == 0) return "blocks must hold at least one token";
  return std::nullopt;
}

}  // namespace

Result<Plan> make_plan(const PlanInput& in) {
  if (auto e = check(in)) return make_error(*e);
  const double kv_given = kv_value_bytes(in);
  const bool shared = in.shared_prefix_tokens > 0;
  Plan plan;
  plan.base = evaluate(in, make_shape(in, kv_given, false), "as given");
  Shape last = make_shape(in, kv_given, shared);
  if (shared) plan.ladder.push_back(evaluate(in, last, "1. shared prefix"));
  if (kv_given > 1) {
    last = make_shape(in, 1, shared);
    plan.ladder.push_back(evaluate(in, last, "2. FP8 KV cache"));
  }
  std::vector<const PlanStep*> config_steps = {&plan.base};
  for (const auto& s : plan.ladder) config_steps.push_back(&s);
  // The first configuration that fits the worker as given; else the one needing the fewest GPUs (the
  // earlier on a tie: a remedy is taken only when it saves GPUs).
  const PlanStep* pick = nullptr;
  for (const PlanStep* s : config_steps) {
    if (s->fits) { pick = s; break; }
  }
  for (const PlanStep* s : config_steps) {
    if (!pick || (!pick->fits && s->workers > 0 && (pick->workers == 0 || s->gpus < pick->gpus))) pick = s;
  }
  plan.recommended = *pick;

  // Remedy 3, for the configuration after remedies 1 and 2: the bytes per token one worker could afford.
  const double room =
      std::max(0.0, usable_bytes(in, std::max<std::uint32_t>(in.gpus_per_worker, 1)) - plan.base.weight_bytes);
  const double tokens = last.tokens(in.concurrency);
  plan.max_kv_bytes_per_token = tokens > 0 ? room / tokens : 0;
  const ModelProfile& m = last.model;
  if (!m.is_mla()) {
    const double per_head = 2.0 * m.num_layers * m.head_dim * m.kv_bytes_per_value;
    plan.max_kv_heads = static_cast<std::uint32_t>(std::floor(plan.max_kv_bytes_per_token / per_head));
    Shape mla = last;
    mla.model.kv_lora_rank = kMlaLatent;
    mla.model.qk_rope_head_dim = kMlaRope;
    mla.bytes_per_token = mla.model.kv_bytes_for_sequence(mla.context) / mla.context;
    plan.mla_kv_bytes_per_token = mla.bytes_per_token;
    plan.ladder.push_back(evaluate(in, mla, "3. MLA-sized KV cache"));
  }
  plan.cpu_tier_tokens =
      plan.recommended.kv_bytes_per_token > 0 ? in.cpu_tier_bytes / plan.recommended.kv_bytes_per_token : 0;
  return plan;
}

namespace {

std::string fmt(const char* f, double a) { return internal::format_number(f, a); }
std::string gib(double b) { return fmt("%.1f GiB", b / kGiB); }
// 147456 -> "147,456".
std::string tok(double t) {
  const std::string digits = fmt("%.0f", t);
  std::string out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}
std::string count(std::uint64_t n) { return tok(static_cast<double>(n)); }

std::string budget_line(const std::string& what, double bytes, const std::string& note = {}) {
  std::string l = "  " + what;
  l.resize(std::max<std::size_t>(l.size() + 1, 34), ' ');
  std::string v = gib(bytes);
  return l + std::string(std::max<std::size_t>(1, 12 - v.size()), ' ') + v + (note.empty() ? "" : "   " + note) + "\n";
}

std::string budget_table(const PlanInput& in, const PlanStep& b) {
  const std::uint32_t tp = std::max<std::uint32_t>(in.gpus_per_worker, 1);
  const double usable = usable_bytes(in, tp);
  std::string r = "budget of one worker (" + std::to_string(tp) + " x " + in.gpu.name + "):\n";
  r += budget_line("weights", b.weight_bytes, fmt("%.3g params", in.model.params) + " x " +
                                                  fmt("%g bytes", b.weight_bytes / std::max(in.model.params, 1.0)));
  r += budget_line("KV per sequence", b.kv_bytes_per_sequence,
                   tok(static_cast<double>(in.context_tokens)) + " tokens x " + fmt("%.1f KiB", b.kv_bytes_per_token / 1024));
  r += budget_line("KV of all sequences", b.kv_bytes_total, std::to_string(in.concurrency) + " sequences");
  r += budget_line("total", b.weight_bytes + b.kv_bytes_total);
  if (in.allowance_bytes > 0) {
    r += budget_line("usable", usable, "device memory less an allowance of " + gib(in.allowance_bytes));
  } else {
    r += budget_line("usable", usable, fmt("%.0f %% of ", in.gpu_memory_utilization * 100) +
                                           fmt("%.0f GB", in.gpu.memory_bytes / 1e9) + (tp > 1 ? " per GPU" : ""));
  }
  r += budget_line("left for KV", std::max(0.0, usable - b.weight_bytes));
  return r;
}

std::string verdict(const PlanInput& in, const PlanStep& b) {
  const double usable = usable_bytes(in, std::max<std::uint32_t>(in.gpus_per_worker, 1));
  if (b.weight_bytes >= usable) return "verdict: the weights alone do not fit; the model needs more GPUs per worker\n";
  if (b.fits)
    return "verdict: fits, " + gib(usable - b.weight_bytes - b.kv_bytes_total) + " to spare; one worker holds " +
           count(b.sequences_on_given) + " sequences of this length\n";
  return "verdict: does not fit, " + gib(b.weight_bytes + b.kv_bytes_total - usable) + " short; one worker holds " +
         count(b.sequences_on_given) + " of the " + std::to_string(in.concurrency) + " sequences\n";
}

// The remedies a configuration took, for "GPUs needed".
std::string label(const PlanStep& s) { return s.name == "as given" ? "no other remedy" : "after remedy " + s.name; }

std::string step_line(const PlanInput& in, const PlanStep& s) {
  std::string r = "  " + s.name + ": " + tok(s.tokens_total) + " cached tokens, KV " + gib(s.kv_bytes_total) +
                  ", total " + gib(s.weight_bytes + s.kv_bytes_total) + " -> " + (s.fits ? "fits" : "does not fit");
  r += "; one worker holds " + count(s.sequences_on_given);
  if (s.workers > 0)
    r += ", " + std::to_string(s.gpus) + " GPU(s) hold " + std::to_string(in.concurrency) + " (workers of " +
         std::to_string(s.gpus_per_worker) + ")";
  return r + "\n";
}

// Remedy 3: the bytes per token one worker affords, in KV heads, and an MLA-sized cache's figures.
std::string mla_text(const PlanInput& in, const Plan& p) {
  std::string r;
  r += "  3. fewer KV heads or MLA: one worker affords " + fmt("%.1f KiB", p.max_kv_bytes_per_token / 1024) +
       " per token";
  if (in.model.is_mla()) {
    r += " (the model already uses MLA)\n";
  } else {
    const PlanStep& mla = p.ladder.back();
    r += ", i.e. at most " + std::to_string(p.max_kv_heads) + " KV heads (the model has " +
         std::to_string(in.model.num_kv_heads) + ")\n";
    r += "     an MLA latent (512 + 64 per layer) would take " + fmt("%.1f KiB", p.mla_kv_bytes_per_token / 1024) +
         " per token:";
    r += step_line(in, mla).substr(mla.name.size() + 3);
  }
  return r;
}

std::string ladder_text(const PlanInput& in, const Plan& p) {
  std::string r = "remedies, each on top of the previous, until one fits:\n";
  if (in.shared_prefix_tokens == 0) r += "  1. shared prefix: none given (--shared-prefix TOKENS --sharing-users N)\n";
  for (const PlanStep& s : p.ladder) {
    if (s.name.starts_with("3.")) break;
    r += step_line(in, s);
    if (s.name.starts_with("1.")) {
      r += fmt("     %.1fx fewer cached tokens than without sharing\n", p.base.tokens_total / s.tokens_total);
    }
    if (s.fits) return r;
  }
  if (kv_value_bytes(in) <= 1) r += "  2. FP8 KV cache: already FP8\n";
  if (p.base.weight_bytes >= usable_bytes(in, std::max<std::uint32_t>(in.gpus_per_worker, 1))) {
    r += "  3. fewer KV heads or MLA: no help while the weights alone exceed one worker\n";
  } else {
    r += mla_text(in, p);
  }
  const PlanStep& cfg = p.recommended;
  r += "  4. more GPUs: ";
  if (cfg.workers == 0) {
    r += "the weights do not fit " + std::to_string(kMaxGpusPerWorker) + " GPUs per worker\n";
  } else {
    r += std::to_string(cfg.workers) + " worker(s) of " + std::to_string(cfg.gpus_per_worker) + " GPU(s) = " +
         std::to_string(cfg.gpus) + " GPU(s) for " + std::to_string(in.concurrency) + " sequences (" + label(cfg) + ")\n";
  }
  return r;
}

}  // namespace

std::string plan_report(const PlanInput& in, const Plan& p) {
  const PlanStep& b = p.base;
  std::string r = "model: " + in.model.name + ", " + fmt("%.0f-bit weights", 8 * (b.weight_bytes / in.model.params)) +
                  ", " + fmt("%.0f-bit KV cache", 8 * kv_value_bytes(in));
  r += "; " + std::to_string(in.concurrency) + " sequences of " + tok(static_cast<double>(in.context_tokens)) +
       " tokens (p95)";
  if (in.shared_prefix_tokens > 0)
    r += ", a prefix of " + tok(static_cast<double>(in.shared_prefix_tokens)) + " tokens shared by " +
         (in.sharing_users > 0 ? std::to_string(in.sharing_users) + " users" : std::string("all"));
  r += "\n\n" + budget_table(in, b) + "\n" + verdict(in, b) + "\n";
  if (!b.fits) r += ladder_text(in, p) + "\n";
  const PlanStep& c = p.recommended;
  r += "GPUs needed: ";
  if (c.workers == 0) {
    r += "none suffices: the weights do not fit " + std::to_string(kMaxGpusPerWorker) + " GPUs\n";
    return r;
  }
  r += std::to_string(c.gpus) + " (" + std::to_string(c.workers) + " worker(s) of " + std::to_string(c.gpus_per_worker) +
       " x " + in.gpu.name + ", " + label(c) + ")\n";
  if (in.cpu_tier_bytes > 0)
    r += "CPU tier: " + gib(in.cpu_tier_bytes) + " per worker keeps " + tok(p.cpu_tier_tokens) +
         " more tokens of evicted prefixes for reuse (running sequences still need GPU memory)\n";
  r += "\nkvroute: --worker-kv-blocks " + std::to_string(c.kv_blocks_per_worker) + " --worker-max-seqs " +
       std::to_string(std::max<std::uint64_t>(c.sequences_per_worker, 1)) + "\n";
  r += "  (the workers: vllm serve --max-num-seqs " + std::to_string(std::max<std::uint64_t>(c.sequences_per_worker, 1)) +
       (c.gpus_per_worker > 1 ? " --tensor-parallel-size " + std::to_string(c.gpus_per_worker) : std::string()) +
       (c.kv_bytes_per_token < b.kv_bytes_per_token ? " --kv-cache-dtype fp8" : std::string()) + ")\n";
  return r;
}

}  // namespace kvroute::sim
