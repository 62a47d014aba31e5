// Engine: scheduler and step-time model of the simulated worker; the contract is in engine.h.
//
// Scheduling follows vLLM v1's scheduler (vllm/v1/core/sched/scheduler.py; behaviour, not code):
//  1. Running sequences first, in admission order: each asks for its remaining prompt chunk or one decode
//     token, limited by the step's token budget. When the free blocks do not cover it, the most recently
//     admitted running sequence is preempted (its blocks freed, its progress dropped: recompute) until they
//     do, possibly the asking sequence itself.
//  2. Then, if nothing was preempted, waiting sequences in FCFS order while budget, blocks and the
//     max_num_seqs cap allow: the prefix match takes GPU hits (and then CPU-tier hits) of whole blocks,
//     never the prompt's last token (vLLM recomputes at least one token to produce logits).
//  3. A CPU-tier hit is loaded back before the sequence computes anything: loads share one link and run
//     alongside steps; the sequence joins the running set when its load ends.
// A step's effects (tokens are sampled, requests finish) apply when it ends. The blocks it computes become
// prefix-cache hits then too, or when it is scheduled (EngineConfig::prefix_commit, vLLM v1's timing).
//
// Step time (architecture section 8, roofline):
//   compute = 2 x compute_params x tokens / (peak x linear_mfu) + attention FLOPs / (peak x attention_mfu)
//   memory  = (weight bytes + KV bytes of every scheduled sequence's context) / bandwidth
//   step    = max(compute, memory) + step_overhead
// Attention FLOPs: 2 x heads x (qk_dim + v_dim) per (query, key) pair and layer; a chunk of c new tokens after
// ctx cached ones attends to c x (ctx + (c + 1) / 2) pairs (causal).
//
// Calibration of the defaults (Qwen3-8B, one H100 SXM; targets from architecture section 1):
//   warm TTFTs (0.07 s at 16K, 0.14 s at 100K) are one short step each (~8 and ~11 ms) plus the front end,
//   which gives frontend_s_per_prompt_token = (0.14 - 0.07 - 0.0037) / 83,616 = 7.93e-7 s (tokenizing and
//   hashing a long prompt) and frontend_overhead_s = 0.0494 s; cold TTFTs (0.55 s at 16K, 7.55 s at 100K,
//   in 8,192-token chunks) then fix linear_mfu = 0.675 and attention_mfu = 0.56 (two equations, two unknowns);
//   the CPU-tier TTFT (0.16 s at 16K) gives a load of 0.09 s for 1,023 blocks x 16 x 144 KiB = 2.41 GB, i.e.
//   26.8 GB/s (PCIe Gen5 x16 is 64 GB/s raw). step_overhead_s = 2 ms puts single-stream decode at ~7 ms/token.
// `kvroute-sim-calibrate` prints the simulated TTFTs against these targets.
#include "backends/sim/engine.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <set>
#include <tuple>
#include <unordered_map>

#include "backends/sim/internal/block_pool.h"

namespace kvroute::sim {

namespace {
constexpr double kDefaultLinearMfu = 0.675;
constexpr double kDefaultAttentionMfu = 0.56;
constexpr double kDefaultStepOverhead = 0.002;
constexpr double kDefaultFrontendOverhead = 0.0494;
constexpr double kDefaultFrontendPerToken = 7.93e-7;
constexpr double kDefaultCpuTransfer = 26.8e9;
}  // namespace

EngineConfig EngineConfig::defaults() {
  auto c = make(kDefaultModel, kDefaultGpu);
  return std::move(c.value());  // the built-in names always resolve
}

Result<EngineConfig> EngineConfig::make(std::string_view model, std::string_view gpu) {
  auto m = builtin_model(model);
  if (!m) return m.error();
  auto g = builtin_gpu(gpu);
  if (!g) return g.error();
  EngineConfig c;
  c.model = std::move(m.value());
  c.gpu = std::move(g.value());
  return c;
}

Result<PrefixCommit> parse_prefix_commit(std::string_view name) {
  if (name == "step-end") return PrefixCommit::kStepEnd;
  if (name == "schedule") return PrefixCommit::kSchedule;
  return make_error("unknown prefix commit '" + std::string(name) + "' (step-end or schedule)");
}

namespace internal {

using SeqState = std::uint8_t;
constexpr SeqState kFrontend = 0, kWaiting = 1, kLoading = 2, kRunning = 3;

struct Seq {
  std::uint64_t id = 0;
  std::uint64_t order = 0;  // submission counter: ties in the front end break by it
  std::vector<std::uint64_t> hashes;
  std::uint32_t prompt_tokens = 0;
  std::uint32_t max_tokens = 1;
  std::uint32_t generated = 0;
  std::uint32_t computed = 0;  // tokens whose KV is in this sequence's blocks
  std::uint32_t cached_tokens = 0;
  std::uint32_t registered = 0;  // leading blocks already offered to the cache
  bool admitted_once = false;
  bool finished = false;
  SeqState state = kFrontend;
  double ready_time = 0;
  double load_done = 0;
  std::vector<BlockId> blocks;
  std::uint32_t total() const { return prompt_tokens + generated; }
};

class EngineImpl {
 public:
  explicit EngineImpl(EngineConfig config) : cfg_(std::move(config)), pool_(0, 0) {
    if (cfg_.block_tokens == 0) cfg_.block_tokens = 16;
    if (cfg_.max_num_seqs == 0) cfg_.max_num_seqs = 1;
    if (cfg_.max_batched_tokens == 0) cfg_.max_batched_tokens = 8192;
    if (cfg_.tensor_parallel == 0) cfg_.tensor_parallel = 1;
    if (cfg_.linear_mfu <= 0) cfg_.linear_mfu = kDefaultLinearMfu;
    if (cfg_.attention_mfu <= 0) cfg_.attention_mfu = kDefaultAttentionMfu;
    if (cfg_.step_overhead_s < 0) cfg_.step_overhead_s = kDefaultStepOverhead;
    if (cfg_.frontend_overhead_s < 0) cfg_.frontend_overhead_s = kDefaultFrontendOverhead;
    if (cfg_.frontend_s_per_prompt_token < 0) cfg_.frontend_s_per_prompt_token = kDefaultFrontendPerToken;
    if (cfg_.cpu_transfer_bytes_per_s <= 0) cfg_.cpu_transfer_bytes_per_s = kDefaultCpuTransfer;
    const KvSizing s =
        kv_sizing(cfg_.model, cfg_.gpu, cfg_.gpu_memory_utilization, cfg_.block_tokens, cfg_.tensor_parallel);
    if (!cfg_.num_gpu_blocks) cfg_.num_gpu_blocks = s.num_blocks;
    block_bytes_ = cfg_.model.kv_bytes_per_token() * cfg_.block_tokens;
    const std::uint64_t cpu_blocks =
        cfg_.cpu_tier_bytes > 0 && block_bytes_ > 0 ? static_cast<std::uint64_t>(cfg_.cpu_tier_bytes / block_bytes_) : 0;
    pool_ = BlockPool(*cfg_.num_gpu_blocks, cpu_blocks);
    const double tp = cfg_.tensor_parallel;
    linear_flops_per_s_ = cfg_.gpu.peak_flops * tp * cfg_.linear_mfu;
    attention_flops_per_s_ = cfg_.gpu.peak_flops * tp * cfg_.attention_mfu;
    bandwidth_ = cfg_.gpu.bandwidth_bytes_per_s * tp;
    weight_bytes_ = cfg_.model.weight_bytes();
    pair_flops_full_ = cfg_.model.attention_flops_per_pair(false);
    pair_flops_sliding_ = cfg_.model.attention_flops_per_pair(true);
  }

  std::uint32_t blocks_for(std::uint64_t tokens) const {
    return static_cast<std::uint32_t>((tokens + cfg_.block_tokens - 1) / cfg_.block_tokens);
  }

  Result<Accepted> submit(SimRequest r, double now) {
    if (seqs_.count(r.id)) return make_error("request id " + std::to_string(r.id) + " is already in the engine");
    if (r.prompt_tokens == 0) return make_error("request " + std::to_string(r.id) + " has no prompt tokens");
    if (r.max_tokens == 0) r.max_tokens = 1;
    const std::uint64_t tokens = static_cast<std::uint64_t>(r.prompt_tokens) + r.max_tokens;
    // The last sampled token is never fed back, so the KV holds at most tokens - 1.
    if (blocks_for(tokens - 1) > pool_.num_gpu_blocks()) {
      return make_error("request " + std::to_string(r.id) + " needs " + std::to_string(tokens) +
                        " tokens of KV cache but the pool holds " +
                        std::to_string(pool_.num_gpu_blocks() * cfg_.block_tokens) + " (prompt + max_tokens - 1)");
    }
    // Hashes beyond the tokens the request will ever compute can never be cached.
    const std::uint64_t max_blocks = (tokens - 1) / cfg_.block_tokens;
    if (r.block_hashes.size() > max_blocks) r.block_hashes.resize(max_blocks);
    if (!in_flight_) clock_ = std::max(clock_, now);
    auto seq = std::make_unique<Seq>();
    seq->id = r.id;
    seq->order = next_order_++;
    seq->hashes = std::move(r.block_hashes);
    seq->prompt_tokens = r.prompt_tokens;
    seq->max_tokens = r.max_tokens;
    seq->ready_time = now + cfg_.frontend_overhead_s + cfg_.frontend_s_per_prompt_token * r.prompt_tokens;
    frontend_.emplace(seq->ready_time, seq->order, seq.get());
    Accepted a{seq->ready_time};
    seqs_.emplace(r.id, std::move(seq));
    return a;
  }

  bool cancel(std::uint64_t id, double now) {
    auto it = seqs_.find(id);
    if (it == seqs_.end()) return false;
    Seq* s = it->second.get();
    switch (s->state) {
      case kFrontend:
        frontend_.erase({s->ready_time, s->order, s});
        break;
      case kWaiting:
        waiting_.erase(std::find(waiting_.begin(), waiting_.end(), s));
        break;
      case kLoading:
        loading_.erase(std::find(loading_.begin(), loading_.end(), s));
        break;
      case kRunning:
        running_.erase(std::find(running_.begin(), running_.end(), s));
        for (auto& p : planned_)
          if (p.seq == s) p.seq = nullptr;
        break;
    }
    pool_.release(s->blocks);
    if (!in_flight_) clock_ = std::max(clock_, now);
    needs_schedule_ = true;
    ++stats_.requests_cancelled;
    seqs_.erase(it);
    return true;
  }

  double next_event_time() const {
    if (in_flight_) return step_end_;
    double t = needs_schedule_ ? clock_ : kInfinity;
    if (!frontend_.empty()) t = std::min(t, std::get<0>(*frontend_.begin()));
    for (const Seq* s : loading_) t = std::min(t, s->load_done);
    return t;
  }

  void advance(double now, EngineSink& sink) {
    for (;;) {
      const double t = next_event_time();
      if (!(t <= now)) break;
      clock_ = std::max(clock_, t);
      if (in_flight_ && step_end_ <= clock_) complete_step(sink);
      while (!frontend_.empty() && std::get<0>(*frontend_.begin()) <= clock_) {
        Seq* s = std::get<2>(*frontend_.begin());
        frontend_.erase(frontend_.begin());
        s->state = kWaiting;
        waiting_.push_back(s);
        needs_schedule_ = true;
      }
      finish_loads(sink);
      if (!in_flight_) start_step(sink);
    }
  }

  bool reset_prefix_cache(double now, EngineSink& sink) {
    return pool_.clear(sink, std::max(clock_, now));
  }

  EngineStats stats() const {
    EngineStats s = stats_;
    s.running = static_cast<std::uint32_t>(running_.size() + loading_.size());
    s.waiting = static_cast<std::uint32_t>(waiting_.size() + frontend_.size());
    s.num_gpu_blocks = pool_.num_gpu_blocks();
    s.num_cpu_blocks = pool_.num_cpu_blocks();
    s.block_tokens = cfg_.block_tokens;
    s.kv_usage = s.num_gpu_blocks ? 1.0 - static_cast<double>(pool_.num_free()) / s.num_gpu_blocks : 0.0;
    s.gpu_cached_blocks = pool_.num_gpu_cached();
    s.cpu_cached_blocks = pool_.num_cpu_cached();
    s.gpu_evictions = pool_.gpu_evictions();
    s.cpu_evictions = pool_.cpu_evictions();
    return s;
  }

  std::vector<std::uint64_t> cached(Medium m) const {
    return m == Medium::kGpu ? pool_.gpu_hashes() : pool_.cpu_hashes();
  }
  const EngineConfig& config() const { return cfg_; }
  const BlockPool& pool() const { return pool_; }

  // One sequence's contribution to a step: `c` new tokens after `ctx` already in its KV.
  struct StepCost {
    double linear_tokens = 0, pairs_full = 0, pairs_sliding = 0, kv_bytes = 0;
    void add(const ModelProfile& m, double c, double ctx) {
      linear_tokens += c;
      pairs_full += c * (ctx + (c + 1) / 2);
      if (m.num_sliding_layers > 0) {
        // A sliding layer attends to at most the window per query token.
        pairs_sliding += c * std::min<double>(ctx + (c + 1) / 2, m.sliding_window);
      }
      kv_bytes += m.kv_bytes_for_sequence(ctx + c);
    }
  };
  double step_seconds(const StepCost& c) const {
    const double compute = 2.0 * cfg_.model.compute_params * c.linear_tokens / linear_flops_per_s_ +
                           (c.pairs_full * pair_flops_full_ + c.pairs_sliding * pair_flops_sliding_) /
                               attention_flops_per_s_;
    const double memory = (weight_bytes_ + c.kv_bytes) / bandwidth_;
    return std::max(compute, memory) + cfg_.step_overhead_s;
  }

 private:
  struct Planned {
    Seq* seq;
    std::uint32_t num_new;
  };

  void preempt(Seq* s) {
    pool_.release(s->blocks);
    s->blocks.clear();
    s->computed = 0;
    s->registered = 0;
    s->state = kWaiting;
    waiting_.push_front(s);
    ++stats_.preemptions;
  }

  void allocate(Seq* s, std::uint32_t n, EngineSink& sink) {
    if (n > 0) pool_.allocate(n, s->blocks, sink, clock_);
  }

  // Puts `num_new` tokens of the sequence into the step being scheduled; with schedule-time commits their
  // full blocks become prefix-cache hits now, for sequences admitted after it.
  void plan(Seq* s, std::uint32_t num_new, EngineSink& sink) {
    planned_.push_back({s, num_new});
    if (cfg_.prefix_commit == PrefixCommit::kSchedule) register_blocks(s, sink, clock_, s->computed + num_new);
  }

  void start_step(EngineSink& sink) {
    needs_schedule_ = false;
    planned_.clear();
    std::uint32_t budget = cfg_.max_batched_tokens;
    bool preempted = false;

    // 1. Running sequences, oldest admission first.
    for (std::size_t i = 0; i < running_.size() && budget > 0; ++i) {
      Seq* s = running_[i];
      const std::uint32_t num_new = std::min(s->total() - s->computed, budget);
      const std::uint32_t want = blocks_for(s->computed + num_new);
      const std::uint32_t need = want > s->blocks.size() ? want - static_cast<std::uint32_t>(s->blocks.size()) : 0;
      bool self_preempted = false;
      while (pool_.num_free() < need) {
        Seq* victim = running_.back();
        running_.pop_back();
        preempt(victim);
        preempted = true;
        if (victim == s) {
          self_preempted = true;
          break;
        }
      }
      if (self_preempted) break;
      allocate(s, need, sink);
      plan(s, num_new, sink);
      budget -= num_new;
    }

    // 2. Waiting sequences, FCFS, unless this step had to preempt (vLLM admits nothing then either).
    const std::uint32_t bt = cfg_.block_tokens;
    while (!preempted && !waiting_.empty() && budget > 0 &&
           running_.size() + loading_.size() < cfg_.max_num_seqs) {
      Seq* s = waiting_.front();
      const std::uint32_t total = s->total();
      const std::uint32_t max_hit = std::min<std::uint32_t>(static_cast<std::uint32_t>(s->hashes.size()), (total - 1) / bt);
      std::uint32_t g = 0, free_hits = 0;
      for (; g < max_hit; ++g) {
        const BlockId b = pool_.lookup_gpu(s->hashes[g]);
        if (b == kNoBlock) break;
        if (pool_.ref_count(b) == 0) ++free_hits;
      }
      std::uint32_t c = 0;
      if (pool_.num_cpu_blocks() > 0)
        while (g + c < max_hit && pool_.contains_cpu(s->hashes[g + c])) ++c;
      const std::uint32_t hit_tokens = (g + c) * bt;
      const std::uint32_t num_new = c > 0 ? 0 : std::min(total - hit_tokens, budget);
      const std::uint32_t need = blocks_for(hit_tokens + num_new) - g;
      if (pool_.num_free() < static_cast<std::uint64_t>(free_hits) + need) break;

      waiting_.pop_front();
      s->blocks.reserve(blocks_for(static_cast<std::uint64_t>(s->prompt_tokens) + s->max_tokens));
      for (std::uint32_t i = 0; i < g; ++i) {
        const BlockId b = pool_.lookup_gpu(s->hashes[i]);
        pool_.acquire(b);
        s->blocks.push_back(b);
      }
      // Keep the blocks about to be loaded from being the CPU tier's next victims.
      for (std::uint32_t i = g; i < g + c; ++i) pool_.touch_cpu(s->hashes[i]);
      allocate(s, need, sink);
      stats_.prefix_cache_queries += total;
      stats_.prefix_cache_hits += static_cast<std::uint64_t>(g) * bt;
      stats_.cpu_cache_hits += static_cast<std::uint64_t>(c) * bt;
      if (!s->admitted_once) {
        s->admitted_once = true;
        s->cached_tokens = std::min(hit_tokens, s->prompt_tokens);
      }
      s->computed = g * bt;
      s->registered = g;
      if (c > 0) {
        // Loads share one host-to-device link, in admission order.
        const double start = std::max(clock_, link_free_at_);
        s->load_done = start + c * block_bytes_ / cfg_.cpu_transfer_bytes_per_s;
        link_free_at_ = s->load_done;
        s->computed = hit_tokens;
        s->state = kLoading;
        loading_.push_back(s);
        continue;
      }
      s->state = kRunning;
      running_.push_back(s);
      plan(s, num_new, sink);
      budget -= num_new;
    }

    if (planned_.empty()) return;
    StepCost cost;
    for (const auto& p : planned_) cost.add(cfg_.model, p.num_new, p.seq->computed);
    step_duration_ = step_seconds(cost);
    in_flight_ = true;
    step_end_ = clock_ + step_duration_;
  }

  // Offers the sequence's full blocks within its first `tokens` tokens to the cache (those not offered yet)
  // and reports each run that was stored.
  void register_blocks(Seq* s, EngineSink& sink, double t, std::uint32_t tokens) {
    const std::uint32_t full =
        std::min<std::uint32_t>(tokens / cfg_.block_tokens, static_cast<std::uint32_t>(s->hashes.size()));
    std::uint32_t run_start = 0, run_len = 0;
    auto flush = [&] {
      if (run_len == 0) return;
      std::optional<std::uint64_t> parent;
      if (run_start > 0) parent = s->hashes[run_start - 1];
      sink.on_blocks_stored(std::span<const std::uint64_t>(s->hashes.data() + run_start, run_len), parent, s->id,
                            run_start, Medium::kGpu, t);
      run_len = 0;
    };
    for (std::uint32_t i = s->registered; i < full; ++i) {
      std::optional<std::uint64_t> parent;
      if (i > 0) parent = s->hashes[i - 1];
      if (pool_.register_hash(s->blocks[i], s->hashes[i], parent, s->id, i)) {
        if (run_len == 0) run_start = i;
        ++run_len;
      } else {
        flush();
      }
    }
    flush();
    if (full > s->registered) s->registered = full;
  }

  void finish_loads(EngineSink& sink) {
    if (loading_.empty()) return;
    for (auto it = loading_.begin(); it != loading_.end();) {
      Seq* s = *it;
      if (s->load_done <= clock_) {
        register_blocks(s, sink, clock_, s->computed);
        s->state = kRunning;
        running_.push_back(s);
        needs_schedule_ = true;
        it = loading_.erase(it);
      } else {
        ++it;
      }
    }
  }

  void complete_step(EngineSink& sink) {
    in_flight_ = false;
    const double t = step_end_;
    ++stats_.steps;
    stats_.busy_seconds += step_duration_;
    finished_ids_.clear();
    for (const auto& p : planned_) {
      Seq* s = p.seq;
      if (!s) continue;  // cancelled mid-step
      const bool decode = s->generated > 0 && s->computed + 1 == s->total();
      if (!decode) stats_.prompt_tokens_computed += p.num_new;
      s->computed += p.num_new;
      if (cfg_.prefix_commit == PrefixCommit::kStepEnd) register_blocks(s, sink, t, s->computed);
      if (s->computed < s->total()) continue;  // a prefill chunk that is not the last
      const std::uint32_t index = s->generated;
      if (index == 0) sink.on_first_token(s->id, t, s->cached_tokens, s->prompt_tokens);
      sink.on_token(s->id, t, index);
      ++s->generated;
      ++stats_.generation_tokens;
      if (s->generated >= s->max_tokens) {
        sink.on_finish(s->id, t, Usage{s->prompt_tokens, s->generated, s->cached_tokens});
        pool_.release(s->blocks);
        s->blocks.clear();
        s->finished = true;
        finished_ids_.push_back(s->id);
        ++stats_.requests_finished;
      }
    }
    planned_.clear();
    if (!finished_ids_.empty()) {
      std::erase_if(running_, [](const Seq* s) { return s->finished; });
      for (std::uint64_t id : finished_ids_) seqs_.erase(id);
    }
    needs_schedule_ = true;
  }

  EngineConfig cfg_;
  BlockPool pool_;
  double block_bytes_ = 0;
  double linear_flops_per_s_ = 1, attention_flops_per_s_ = 1, bandwidth_ = 1, weight_bytes_ = 0;
  double pair_flops_full_ = 0, pair_flops_sliding_ = 0;

  std::unordered_map<std::uint64_t, std::unique_ptr<Seq>> seqs_;
  std::set<std::tuple<double, std::uint64_t, Seq*>> frontend_;
  std::deque<Seq*> waiting_;
  std::vector<Seq*> loading_;
  std::vector<Seq*> running_;
  std::vector<Planned> planned_;
  std::vector<std::uint64_t> finished_ids_;
  std::uint64_t next_order_ = 0;

  double clock_ = 0;
  bool in_flight_ = false;
  bool needs_schedule_ = false;
  double step_end_ = 0;
  double step_duration_ = 0;
  double link_free_at_ = 0;
  EngineStats stats_;
};

}  // namespace internal

Engine::Engine(EngineConfig config) : impl_(std::make_unique<internal::EngineImpl>(std::move(config))) {}
Engine::~Engine() = default;
Engine::Engine(Engine&&) noexcept = default;
Engine& Engine::operator=(Engine&&) noexcept = default;

Result<Accepted> Engine::submit(SimRequest request, double now) { return impl_->submit(std::move(request), now); }
bool Engine::cancel(std::uint64_t id, double now) { return impl_->cancel(id, now); }
double Engine::next_event_time() const { return impl_->next_event_time(); }
void Engine::advance(double now, EngineSink& sink) { impl_->advance(now, sink); }
bool Engine::reset_prefix_cache(double now, EngineSink& sink) { return impl_->reset_prefix_cache(now, sink); }
EngineStats Engine::stats() const { return impl_->stats(); }
std::vector<std::uint64_t> Engine::cached_block_hashes(Medium medium) const { return impl_->cached(medium); }
const EngineConfig& Engine::config() const { return impl_->config(); }

double Engine::step_time(std::span<const std::pair<std::uint32_t, std::uint32_t>> prefill,
                         std::span<const std::uint32_t> decode_context) const {
  internal::EngineImpl::StepCost c;
  const ModelProfile& m = impl_->config().model;
  for (const auto& [n, ctx] : prefill) c.add(m, n, ctx);
  for (std::uint32_t ctx : decode_context) c.add(m, 1, ctx);
  return impl_->step_seconds(c);
}

}  // namespace kvroute::sim
