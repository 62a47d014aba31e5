#include "bench/simulate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <fstream>
#include <limits>
#include <memory>
#include <queue>
#include <unordered_map>

#include "backends/sim/engine.h"
#include "hashing/computing_prefixes.h"
#include "hashing/prefix_index.h"
#include "policy/burst_stagger.h"
#include "policy/prefill_queue.h"
#include "policy/rate_learner.h"
#include "policy/recent_quantile.h"

namespace kvroute::bench {

Result<ModeChoice> parse_mode(std::string_view s) {
  if (s == "native") return ModeChoice::kNative;
  if (s == "approximate" || s == "approx") return ModeChoice::kApproximate;
  if (s == "precise") return ModeChoice::kPrecise;
  if (s == "both") return ModeChoice::kBoth;
  return make_error("--mode must be native, approximate, precise or both (got '" + std::string(s) + "')");
}

Result<Sharing> parse_sharing(std::string_view s) {
  if (s == "none") return Sharing::kNone;
  if (s == "redis") return Sharing::kRedis;
  return make_error("--sharing must be none or redis (got '" + std::string(s) + "')");
}

IndexMode native_mode(std::string_view p) {
  if (p == "cache_aware" || p == "e2") return IndexMode::kApproximate;
  if (p == "block_cost" || p == "weighted_scorers" || p == "kv_cost") return IndexMode::kPrecise;
  return IndexMode::kNone;
}

Result<std::vector<PolicyRun>> plan_runs(const std::vector<std::string>& policies, ModeChoice mode) {
  std::vector<PolicyRun> runs;
  const auto& known = policy::policy_names();
  for (const auto& p : policies) {
    if (std::find(known.begin(), known.end(), p) == known.end()) {
      auto err = policy::make_policy(p, {});  // for its message listing the valid names
      return err.error();
    }
    const IndexMode native = native_mode(p);
    auto label = [&](IndexMode m) {
      if (m == native || native == IndexMode::kNone) return p;
      return p + (m == IndexMode::kApproximate ? "(approx)" : "(precise)");
    };
    if (native == IndexMode::kNone) {
      runs.push_back({p, IndexMode::kNone, p});
      continue;
    }
    switch (mode) {
      case ModeChoice::kNative: runs.push_back({p, native, label(native)}); break;
      case ModeChoice::kApproximate: runs.push_back({p, IndexMode::kApproximate, label(IndexMode::kApproximate)}); break;
      case ModeChoice::kPrecise: runs.push_back({p, IndexMode::kPrecise, label(IndexMode::kPrecise)}); break;
      case ModeChoice::kBoth:
        runs.push_back({p, native, label(native)});
        {
          const IndexMode other = native == IndexMode::kPrecise ? IndexMode::kApproximate : IndexMode::kPrecise;
          runs.push_back({p, other, label(other)});
        }
        break;
    }
  }
  return runs;
}

namespace {

Result<sim::EngineConfig> engine_config(const SimOptions& o) {
  auto cfg = sim::EngineConfig::make(o.model, o.gpu);
  if (!cfg) return cfg.error();
  cfg->cpu_tier_bytes = std::max(0.0, o.cpu_tier_gb) * 1e9;
  cfg->prefix_commit = o.prefix_commit;
  return cfg;
}

// Profile-derived starting rates for the RateLearner: prefill throughput of a full 8K chunk over an 8K
// context (the reference context of policy/rate_learner.h), the CPU->GPU link in tokens/s, and the decode
// step as empty-batch time + time per context token of the batch (from a 64 x 16K batch).
policy::WorkerRates prior_rates(const sim::Engine& e) {
  policy::WorkerRates r;
  const std::pair<std::uint32_t, std::uint32_t> chunk[1] = {{8192, 8192}};
  r.prefill_tokens_per_s = 8192.0 / e.step_time(chunk, {});
  const double kv_per_token = e.config().model.kv_bytes_per_token();
  r.transfer_tokens_per_s = kv_per_token > 0 ? e.config().cpu_transfer_bytes_per_s / kv_per_token : 1e6;
  r.decode_step_s = e.step_time({}, {});
  const std::vector<std::uint32_t> batch(64, 16384);
  r.decode_step_per_token_s = (e.step_time({}, batch) - r.decode_step_s) / (64.0 * 16384.0);
  r.base_ttft_s = e.config().frontend_overhead_s;
  return r;
}

}  // namespace

double percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0.0;
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(pos));
  const std::size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (pos - static_cast<double>(lo)) * (sorted[hi] - sorted[lo]);
}

LatencyStats stats_of(std::vector<double> v) {
  LatencyStats s;
  std::sort(v.begin(), v.end());
  s.count = v.size();
  if (v.empty()) return s;
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / static_cast<double>(v.size());
  s.p50 = percentile(v, 0.50);
  s.p90 = percentile(v, 0.90);
  s.p99 = percentile(v, 0.99);
  return s;
}

void RequestTally::add(double ttft_s, double e2e_s, double decode_s, std::uint32_t itl_tokens, std::uint64_t cached,
                       std::uint64_t prompt, std::uint64_t output, double start_s, double end_s) {
  ttft_.push_back(ttft_s);
  (2ull * cached >= prompt ? warm_ : cold_).push_back(ttft_s);
  e2e_sum_ += e2e_s;
  e2e_.push_back(e2e_s);
  if (itl_tokens >= 2) {
    itl_num_ += decode_s;
    itl_den_ += itl_tokens - 1;
    itl_.push_back(decode_s / (itl_tokens - 1));
  }
  cached_ += cached;
  prompt_ += prompt;
  output_ += output;
  first_ = std::min(first_, start_s);
  last_ = std::max(last_, end_s);
}

double RequestTally::fill(PolicyResult& res) {
  res.completed = ttft_.size();
  res.hit_rate = prompt_ ? static_cast<double>(cached_) / static_cast<double>(prompt_) : 0.0;
  res.ttft = stats_of(ttft_);
  res.ttft_cold = stats_of(cold_);
  res.ttft_warm = stats_of(warm_);
  res.e2e_mean_s = res.completed ? e2e_sum_ / static_cast<double>(res.completed) : 0.0;
  res.itl_mean_s = itl_den_ > 0 ? itl_num_ / itl_den_ : 0.0;
  res.itl_p99_s = stats_of(itl_).p99;
  res.e2e_p99_s = stats_of(e2e_).p99;
  const LatencyStats te = stats_of(ttft_err_), ie = stats_of(itl_err_);
  res.calibration = {te.p50, te.p90, ie.p50, ie.p90, te.count, ie.count};
  std::sort(ttft_.begin(), ttft_.end());
  res.ttfts = std::move(ttft_);
  ttft_.clear();
  return last_ > first_ ? static_cast<double>(output_) / (last_ - first_) : 0.0;
}

void RequestTally::add_estimate(double ttft_s, double ttft_est_s, double itl_s, double itl_est_s) {
  if (ttft_est_s > 0) ttft_err_.push_back(std::abs(ttft_s / ttft_est_s - 1.0));
  if (itl_est_s > 0 && itl_s > 0) itl_err_.push_back(std::abs(itl_s / itl_est_s - 1.0));
}

double coefficient_of_variation(const std::vector<double>& v) {
  if (v.empty()) return 0.0;
  double mean = 0;
  for (double x : v) mean += x;
  mean /= static_cast<double>(v.size());
  if (mean <= 0) return 0.0;
  double var = 0;
  for (double x : v) var += (x - mean) * (x - mean);
  return std::sqrt(var / static_cast<double>(v.size())) / mean;
}

namespace {

std::uint64_t mix(std::uint64_t a, std::uint64_t b) {
  std::uint64_t z = a ^ (b + 0x9E3779B97F4A7C15ull + (a << 6) + (a >> 2));
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

class FleetSim {
 public:
  FleetSim(const Workload& w, const PolicyRun& run, const SimOptions& o, const policy::RoutingPolicy& policy,
           const sim::EngineConfig& cfg)
      : w_(w), run_(run), o_(o), policy_(policy), n_(o.workers) {
    engines_.reserve(n_);
    for (std::size_t i = 0; i < n_; ++i) engines_.emplace_back(cfg);
    const sim::EngineStats st = engines_[0].stats();
    gpu_blocks_ = st.num_gpu_blocks;
    cpu_tier_ = st.num_cpu_blocks > 0;
    const policy::WorkerRates prior = prior_rates(engines_[0]);
    workers_.resize(n_);
    views_.resize(n_);
    sinks_.reserve(n_);
    const std::size_t replicas = std::max<std::size_t>(o.replicas, 1);
    sharing_ = o.sharing == Sharing::kRedis && replicas > 1;
    for (std::size_t r = 0; r < replicas; ++r) {
      auto rep = std::make_unique<Replica>();
      rep->load.resize(n_);
      rep->remote.resize(n_);
      rep->remote_at.resize(n_, 0.0);
      rep->last_opened.resize(n_, -std::numeric_limits<double>::infinity());
      rep->others_ended.resize(n_, 0);
      rep->ended_at_poll.resize(n_, 0);
      rep->peers.resize(replicas);
      // Each replica's exchanges run on its own clock: their phases spread over the interval.
      rep->next_load = o.load_interval_s * static_cast<double>(r) / static_cast<double>(replicas);
      rep->next_rates = o.rates_interval_s * static_cast<double>(r) / static_cast<double>(replicas);
      for (std::size_t i = 0; i < n_; ++i) {
        rep->learner.set_prior(static_cast<WorkerId>(i), prior);
        if (run_.mode == IndexMode::kApproximate) rep->index.set_capacity(static_cast<WorkerId>(i), gpu_blocks_);
      }
      reps_.push_back(std::move(rep));
    }
    rates_board_.resize(n_);
    for (std::size_t i = 0; i < n_; ++i) {
      const auto id = static_cast<WorkerId>(i);
      sinks_.emplace_back(this, id);
      workers_[i].deliveries.clear();
      if (cpu_tier_) workers_[i].media = std::make_unique<std::unordered_map<std::uint64_t, std::uint8_t>>();
    }
    max_running_ = cfg.max_num_seqs;
    flights_.resize(w.requests.size());
    uses_match_ = policy_.uses_prefix_match() && run_.mode != IndexMode::kNone;
    holds_ = uses_match_ && run_.mode == IndexMode::kPrecise && policy_.waits_for_computing_prefix() &&
             o_.prefix_hold_s > 0;
  }

  PolicyResult run(std::atomic<std::size_t>* progress) {
    const auto wall0 = std::chrono::steady_clock::now();
    const double scale = o_.rate_scale > 0 ? o_.rate_scale : 1.0;
    double next_poll = 0;
    const double interval = o_.metrics_interval_s;
    first_arrival_ = w_.requests.empty() ? 0.0 : w_.requests.front().arrival_s / scale;
    last_arrival_ = w_.requests.empty() ? 0.0 : w_.requests.back().arrival_s / scale;
    poll_metrics();
    // Everything up to t: metric polls and the replicas' exchanges, in time order, then the engines.
    auto step_to = [&](double t) {
      // Polls first at a tie.
      for (;;) {
        const double poll = interval > 0 ? next_poll + interval : sim::kInfinity;
        std::size_t who = 0;
        double tick = sim::kInfinity;
        for (std::size_t k = 0; sharing_ && k < reps_.size(); ++k) {
          const double tk = std::min(reps_[k]->next_load, reps_[k]->next_rates);
          if (tk < tick) tick = tk, who = k;
        }
        const double te = std::min(poll, tick);
        if (te > t) break;
        advance_all(te);
        if (poll <= tick) {
          next_poll = poll;
          poll_metrics();
        } else if (reps_[who]->next_load <= reps_[who]->next_rates) {
          exchange_load(who, te);
        } else {
          exchange_rates(who, te);
        }
      }
      advance_all(t);
      apply_deliveries(t);
      apply_stream(t);
      if (interval <= 0) poll_metrics();
    };
    // Arrivals a replica routes later (policy::BurstStagger: replicas take turns in bursts), by time, then id.
    using Later = std::pair<double, std::size_t>;
    std::priority_queue<Later, std::vector<Later>, std::greater<>> later;
    auto route_later_until = [&](double t) {
      while (!later.empty() && later.top().first <= t) {
        const auto [at, j] = later.top();
        later.pop();
        step_to(at);
        route(w_.requests[j], at, j % reps_.size(), w_.requests[j].arrival_s / scale);
      }
    };
    for (std::size_t i = 0; i < w_.requests.size(); ++i) {
      const Request& r = w_.requests[i];
      const double t = r.arrival_s / scale;
      route_later_until(t);
      step_to(t);
      const std::size_t replica = i % reps_.size();
      if (progress) progress->fetch_add(1, std::memory_order_relaxed);
      if (sharing_ && o_.stagger && o_.sync_delay_s <= o_.load_interval_s) {
        // As Router::stagger_s: rank = the replica's index, the stream delay as modelled.
        Replica& rep = *reps_[replica];
        const double prefill_s = rep.learner.typical_prefill_s(static_cast<double>(r.prompt_tokens));
        const double wait = rep.stagger.arrive(t, replica, reps_.size(), o_.sync_delay_s, prefill_s);
        if (wait > 0) {
          // A hair past the records' arrival, so that they are applied first.
          later.push({t + wait * (1.0 + 1e-9), i});
          ++staggered_;
          continue;
        }
      }
      route(r, t, replica, t);
    }
    route_later_until(sim::kInfinity);
    for (std::size_t e = 0; e < n_; ++e) {
      while (engines_[e].next_event_time() < sim::kInfinity || !workers_[e].held.empty()) {
        advance_engine(e, std::min(engines_[e].next_event_time(), workers_[e].next_release()));
      }
    }
    PolicyResult res = summarize();
    if (!o_.dump_dir.empty()) dump();
    res.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
    return res;
  }

 private:
  using WorkerId = hashing::WorkerId;

  struct Delivery {
    double t;
    enum Kind : std::uint8_t { kStored, kRemoved, kCleared } kind;
    sim::Medium medium;
    std::vector<std::uint64_t> hashes;
  };

  // One router replica's own load on one worker: the requests it sent there (as backends::Worker tracks them).
  struct RouterLoad {
    std::uint32_t in_flight = 0;
    std::uint64_t pending_prefill = 0;
    // The same requests with their prefill estimates, by request id (as backends::Worker keeps them).
    policy::PrefillQueue prefill_queue;
    std::uint64_t active_decode = 0;
    std::uint64_t inflight_kv = 0;  // as backends::Worker: uncached prompt + output tokens of requests in flight
    std::uint64_t ended = 0;        // requests that finished there (backends::Worker::ended)
  };

  // What one router replica (one kvroute process) knows: its index, session bindings, learned rates and TTFT
  // tail, the load of the requests it sent, and, with sharing, the others' load as it last read it. With one
  // replica this is the whole router.
  struct Replica {
    hashing::PrefixIndex index;
    hashing::ComputingPrefixes computing;
    policy::RateLearner learner;
    std::unordered_map<std::uint64_t, std::pair<std::size_t, double>> sessions;  // session -> (worker, last use)
    std::vector<double> last_opened;  // by worker: when a session was last bound to it anew (as Router::bind_session)
    policy::BurstStagger stagger;  // sharing: its own arrivals, to take turns with the others in bursts
    std::uint64_t sequence = 0;    // requests it routed (RoutingContext::sequence, as Router's sequence_)
    // The own contexts of this replica's sessions' later turns (RoutingContext::session_context_tokens).
    policy::RecentQuantile session_context{policy::kFleetTailWindow, 1.0, 20, 1};
    // The means of this replica's completed requests' latencies (RoutingContext::fleet_means).
    policy::RecentLatencies latencies;
    std::vector<RouterLoad> load;             // by worker
    std::vector<policy::LoadShare> remote;    // by worker: the sum of the others' load as last read
    std::vector<double> remote_at;            // by worker: the time `remote` is as of (policy::queued_at)
    // By worker: the requests the others saw end there, as last read, and the routers' ends (its own and the
    // others') when the worker's metrics were last polled (policy::settle_report).
    std::vector<std::uint64_t> others_ended, ended_at_poll;
    // This replica's published load (the daemon's P:load:REPLICA key), oldest first.
    struct Published {
      double at;                               // readable from
      std::uint64_t seq;                       // the routed records it covers (those with seq <= this)
      std::vector<policy::LoadShare> load;     // by worker
      std::vector<std::uint64_t> ended;        // by worker: RouterLoad::ended
    };
    std::deque<Published> published;
    std::uint64_t routed_seq = 0;              // routed records sent
    // What this replica knows of each other one's load: its last published load read, plus the load of the
    // requests it routed since (their records came on the stream after that load was taken).
    struct Peer {
      std::uint64_t covered = 0;
      std::vector<policy::LoadShare> load;
      std::vector<std::uint64_t> ended;
      std::vector<std::pair<std::uint64_t, std::pair<WorkerId, policy::TimedShare>>> since;
    };
    std::vector<Peer> peers;                   // by replica
    double next_load = 0, next_rates = 0;      // its next load and rates exchanges
  };

  // A routed record on the shared stream (the daemon's SharedState::routed): the others apply it from `at`.
  struct StreamRecord {
    double at;
    std::uint32_t from;        // the replica that routed it
    WorkerId worker;
    std::uint64_t request;     // whose chain (the hashes are on the record)
    std::uint64_t session;     // the session it bound, 0: none
    std::uint32_t computes_from;  // precise mode: the chain's blocks from here on are computed by the request
    std::uint64_t seq;         // the sender's count of routed records, this one included
    policy::LoadShare load;    // what the request adds to the worker's load
    bool binding_only = false;  // a session bound where nothing of the request went: the binding is all it carries
  };

  struct WorkerState {
    // Last polled metrics.
    std::uint32_t running = 0, waiting = 0;
    double kv_usage = 0;
    std::deque<Delivery> deliveries;  // KV events on their way to the index, in order
    // Media holding each block, kept only with a CPU tier (the index has one tier per entry).
    std::unique_ptr<std::unordered_map<std::uint64_t, std::uint8_t>> media;
    std::uint64_t routed = 0;
    // Requests held until the prefix an earlier request is computing here lands (hashing/computing_prefixes.h).
    struct Held {
      std::uint64_t id;
      std::uint32_t replica;  // the router replica that holds it (its leader's token is that replica's)
      double release_at;  // the hold's end, brought forward when the prefix lands
      std::uint64_t block;  // the last block of its prefix
      hashing::ComputingPrefixes::Token leader;
    };
    std::vector<Held> held;
    // When the next held request goes (infinity with none held).
    double next_release() const {
      double t = sim::kInfinity;
      for (const auto& h : held) t = std::min(t, h.release_at);
      return t;
    }
  };

  struct Flight {
    WorkerId worker = 0;
    std::uint32_t replica = 0;  // the router replica the request arrived at
    bool submitted = false;
    double arrival = 0;
    double first_token = -1;
    double finish = -1;
    double queue_est = 0;
    double estimate = 0;                 // the pick's TTFT estimate (what the learner learns from; debug dump)
    double uncorrected_estimate = 0;     // the TTFT reported before the learned correction (what the learner checks)
    double reported_estimate = 0;        // the same as reported, corrected by the worker's learned error (calibration)
    double itl_estimate = 0;             // the pick's ITL estimate (calibration)
    policy::WorkerView view_at_dispatch;  // the worker as the pick saw it (debug dump)
    std::uint64_t best_matched = 0;      // longest match any worker had (debug dump)
    int bound = -1;                      // the session's bound worker, -1 if none (debug dump)
    std::uint64_t decode_context = 0;
    std::uint64_t predicted_uncached = 0;
    std::uint64_t kv_tokens = 0;  // its share of WorkerState::inflight_kv
    std::uint32_t cached = 0;
    hashing::ComputingPrefixes::Token computing = 0;  // the blocks it computes, until its first token
    std::unique_ptr<sim::SimRequest> held;            // while held: the request, sent when released
    std::uint64_t source = 0;                         // a warm-up: the request whose prompt it computes
  };

  // Warm-ups (policy::Pick::warm) have ids from here on: the prompt of a request sent to a second worker for one
  // output token, off any request's path. They load the worker like any request but are not users' requests: no
  // latency, learned rate or throughput counts them.
  static constexpr std::uint64_t kWarmIds = std::uint64_t{1} << 62;
  static bool is_warm(std::uint64_t id) { return id >= kWarmIds; }
  Flight& flight(std::uint64_t id) { return is_warm(id) ? warms_.at(id) : flights_[id]; }
  const Request& request_of(std::uint64_t id) {
    return w_.requests[is_warm(id) ? warms_.at(id).source : id];
  }

  class Sink final : public sim::EngineSink {
   public:
    Sink(FleetSim* sim, WorkerId w) : sim_(sim), w_(w) {}
    void on_first_token(std::uint64_t id, double t, std::uint32_t cached, std::uint32_t) override {
      sim_->first_token(w_, id, t, cached);
    }
    void on_finish(std::uint64_t id, double t, const sim::Usage& u) override { sim_->finish(w_, id, t, u); }
    void on_token(std::uint64_t id, double t, std::uint32_t) override {
      if (t <= sim_->last_arrival_ && !is_warm(id)) ++sim_->tokens_in_window_;
    }
    void on_blocks_stored(std::span<const std::uint64_t> h, std::optional<std::uint64_t>, std::uint64_t,
                          std::uint32_t, sim::Medium m, double t) override {
      sim_->kv_event(w_, Delivery::kStored, m, h, t);
    }
    void on_blocks_removed(std::span<const std::uint64_t> h, sim::Medium m, double t) override {
      sim_->kv_event(w_, Delivery::kRemoved, m, h, t);
    }
    void on_all_cleared(double t) override { sim_->kv_event(w_, Delivery::kCleared, sim::Medium::kGpu, {}, t); }

   private:
    FleetSim* sim_;
    WorkerId w_;
  };

  void advance_all(double t) {
    for (std::size_t e = 0; e < n_; ++e) advance_engine(e, t);
  }

  // Runs engine e up to t. With requests held for it, step by step, so that each is submitted at the moment
  // it is released (its prefix landed, or its hold ran out).
  void advance_engine(std::size_t e, double t) {
    WorkerState& ws = workers_[e];
    while (true) {
      if (ws.held.empty()) {
        if (engines_[e].next_event_time() <= t) engines_[e].advance(t, sinks_[e]);
        return;
      }
      const double next = engines_[e].next_event_time();
      const double te = std::min(next, ws.next_release());
      if (te > t) return;
      if (next <= te) engines_[e].advance(te, sinks_[e]);
      for (std::size_t i = 0; i < ws.held.size();) {
        if (ws.held[i].release_at > te) {
          ++i;
          continue;
        }
        Flight& f = flight(ws.held[i].id);
        if (!engines_[e].submit(std::move(*f.held), te)) unsubmit(static_cast<WorkerId>(e), ws.held[i].id, f, te);
        f.held.reset();
        ws.held[i] = ws.held.back();
        ws.held.pop_back();
      }
    }
  }

  void poll_metrics() {
    for (std::size_t e = 0; e < n_; ++e) {
      const sim::EngineStats s = engines_[e].stats();
      workers_[e].running = s.running;
      workers_[e].waiting = s.waiting;
      workers_[e].kv_usage = s.kv_usage;
      for (auto& rep : reps_) rep->ended_at_poll[e] = rep->load[e].ended + rep->others_ended[e];
    }
  }

  void first_token(WorkerId w, std::uint64_t id, double t, std::uint32_t cached) {
    Flight& f = flight(id);
    WorkerState& ws = workers_[w];
    Replica& rep = *reps_[f.replica];
    RouterLoad& l = rep.load[w];
    f.first_token = t;
    f.cached = cached;
    if (!is_warm(id)) rep.latencies.first_token(t - f.arrival);
    l.pending_prefill -= std::min(l.pending_prefill, f.predicted_uncached);
    l.prefill_queue.remove(id, /*first_token=*/true, t);
    // The router sees a streamed first token: when the worker's event stored the last block this request
    // computed, against now, teaches the worker's commit timing (Router::first_byte).
    const auto unstored = rep.computing.first_token(w, f.computing, t);
    // Requests held for this one's prefix go now (the router sees its first byte).
    for (auto& h : ws.held)
      if (h.leader == f.computing && h.replica == f.replica) h.release_at = std::min(h.release_at, t);
    // ... and those the other replicas hold for it once its record reaches them (SharedState::prefix_computed,
    // sent when the worker's event has not stored the prefix yet). The others' entries for it went when the
    // engine emitted that event (kv_event() applies it at once, dated when it arrives), so the held requests
    // are found by the block they wait for.
    if (sharing_ && unstored) {
      const auto& chain = request_of(id).chain.hashes;
      for (auto& h : ws.held)
        if (h.replica != f.replica && std::find(chain.begin(), chain.end(), h.block) != chain.end())
          h.release_at = std::min(h.release_at, t + o_.sync_delay_s);
    }
    l.active_decode += request_of(id).prompt_tokens;
    // The worker's decode context as the daemon learns from it (the view it priced: its own load plus what the
    // other replicas' published load and records add), not this replica's share alone.
    f.decode_context = l.active_decode;
    if (sharing_) f.decode_context += others_load(rep, w, t).active_decode_tokens;
  }

  void finish(WorkerId w, std::uint64_t id, double t, const sim::Usage& u) {
    Flight& f = flight(id);
    Replica& rep = *reps_[f.replica];
    RouterLoad& l = rep.load[w];
    f.finish = t;
    f.cached = u.cached_tokens;
    l.in_flight -= 1;
    ++l.ended;
    l.inflight_kv -= std::min(l.inflight_kv, f.kv_tokens);
    l.active_decode -= std::min<std::uint64_t>(l.active_decode, request_of(id).prompt_tokens);
    if (is_warm(id)) {
      warms_.erase(id);
      return;
    }
    // What the daemon learns from a completed response: TTFT at the client, usage.cached_tokens, ITL.
    policy::RateObservation obs;
    obs.ttft_s = f.first_token - f.arrival;
    obs.queue_s = f.queue_est;
    obs.uncached_tokens = u.prompt_tokens - std::min(u.prompt_tokens, u.cached_tokens);
    obs.cached_tokens = u.cached_tokens;
    obs.decode_context_tokens = f.decode_context;
    obs.output_tokens = u.completion_tokens;
    obs.itl_s = u.completion_tokens >= 2 ? (t - f.first_token) / (u.completion_tokens - 1) : 0.0;
    obs.estimated_ttft_s = f.uncorrected_estimate;
    obs.estimated_itl_s = f.itl_estimate;
    rep.learner.observe(w, obs);
    rep.latencies.completed(obs.itl_s, t - f.arrival);
  }

  void kv_event(WorkerId w, Delivery::Kind kind, sim::Medium m, std::span<const std::uint64_t> h, double t) {
    if (run_.mode != IndexMode::kPrecise) return;
    WorkerState& ws = workers_[w];
    if (kind == Delivery::kStored && m == sim::Medium::kGpu && holds_) {
      // When the router will have the event: the commit timing of prefix holds (Router's store listener) and
      // the release of requests held for one of these blocks (engines that make blocks hits when they
      // schedule them say so at once).
      const double arrives = t + std::max(o_.event_delay_s, 0.0);
      for (auto& rep : reps_) rep->computing.stored(w, h, arrives);
      for (auto& hd : ws.held)
        if (std::find(h.begin(), h.end(), hd.block) != h.end()) hd.release_at = std::min(hd.release_at, arrives);
    }
    if (o_.event_delay_s <= 0) {
      apply(w, kind, m, h);
      return;
    }
    ws.deliveries.push_back(Delivery{t + o_.event_delay_s, kind, m, std::vector<std::uint64_t>(h.begin(), h.end())});
  }

  void apply_deliveries(double now) {
    if (run_.mode != IndexMode::kPrecise) return;
    for (std::size_t e = 0; e < n_; ++e) {
      auto& q = workers_[e].deliveries;
      while (!q.empty() && q.front().t <= now) {
        apply(static_cast<WorkerId>(e), q.front().kind, q.front().medium, q.front().hashes);
        q.pop_front();
      }
    }
  }

  // ---- What the replicas share (sharing on), modelled on the daemon's SharedState (backends/shared_state) ----

  // Binds `session` to worker `w` at `t` on replica `rep`, as Router::bind_session: a binding made anew (none, or
  // expired) is an opening there.
  void bind(Replica& rep, std::uint64_t session, std::size_t w, double t) {
    auto [it, inserted] = rep.sessions.try_emplace(session, w, t);
    if (inserted || t - it->second.second > o_.session_ttl_s) rep.last_opened[w] = t;
    it->second = {w, t};
  }

  // The routed records readable by now: every other replica applies the prediction to its index as its own
  // (ReplicaSync::apply_routed, approximate mode) and adopts the session binding.
  void apply_stream(double now) {
    while (!stream_.empty() && stream_.front().at <= now) {
      const StreamRecord& rec = stream_.front();
      for (std::size_t q = 0; q < reps_.size(); ++q) {
        if (q == rec.from) continue;
        Replica& rep = *reps_[q];
        if (rec.binding_only) {
          bind(rep, rec.session, rec.worker, rec.at);
          continue;
        }
        const auto& hashes = w_.requests[rec.request].chain.hashes;
        if (run_.mode == IndexMode::kApproximate && uses_match_) rep.index.record(rec.worker, hashes, hashing::Tier::kPredicted);
        // Precise mode: the blocks the request will compute, predicted until the worker's events store them (as
        // the sender's own expect()); without them a burst on a new prefix looks cold on every other replica.
        if (run_.mode == IndexMode::kPrecise && uses_match_) rep.index.expect(rec.worker, hashes);
        // ... and what it computes, for prefix holds here (ComputingPrefixes::begin_elsewhere).
        if (holds_) rep.computing.begin_elsewhere(rec.worker, hashes, rec.computes_from, rec.at);
        if (rec.session != 0) bind(rep, rec.session, rec.worker, rec.at);
        Replica::Peer& peer = rep.peers[rec.from];
        if (rec.seq > peer.covered) {
          peer.since.push_back({rec.seq, {rec.worker, {rec.at, rec.load}}});
          // As the daemon's SharedState hands it on: what was there drains until the record came.
          rep.remote[rec.worker].drain(rec.at - rep.remote_at[rec.worker]);
          rep.remote[rec.worker].add(rec.load);
          rep.remote_at[rec.worker] = std::max(rep.remote_at[rec.worker], rec.at);
        }
      }
      stream_.pop_front();
    }
  }

  // The other replicas' load on worker `w` as replica `rep` prices it at `t`: the sum it last read, drained since.
  static policy::LoadShare others_load(const Replica& rep, std::size_t w, double t) {
    policy::LoadShare remote = rep.remote[w];
    remote.drain(t - rep.remote_at[w]);
    return remote;
  }

  // Replica `k`'s load exchange at `now` (SharedState::exchange_load, every --shared-state-interval): it
  // publishes its own load per worker, readable by the others sync_delay_s later, and reads the latest load
  // each other replica published as the sum it prices until its next exchange.
  void exchange_load(std::size_t k, double now) {
    Replica& rep = *reps_[k];
    rep.next_load = now + std::max(o_.load_interval_s, 1e-3);
    std::vector<policy::LoadShare> mine(n_);
    std::vector<std::uint64_t> ended(n_);
    for (std::size_t i = 0; i < n_; ++i) {
      const RouterLoad& l = rep.load[i];
      ended[i] = l.ended;
      if (l.in_flight == 0) continue;
      policy::WorkerView v;
      l.prefill_queue.fill(v, now);
      mine[i] = {l.in_flight, l.pending_prefill, l.active_decode, v.pending_prefill_s, v.oldest_prefill_s,
                 l.pending_prefill > 0 ? v.prefill_elapsed_s : 0.0, l.inflight_kv};
    }
    rep.published.push_back({now + o_.sync_delay_s, rep.routed_seq, std::move(mine), std::move(ended)});
    std::vector<std::vector<policy::TimedShare>> parts(n_);  // by worker
    for (std::size_t q = 0; q < reps_.size(); ++q) {
      if (q == k) continue;
      auto& pub = reps_[q]->published;
      // Exchanges run in time order, so a record a later one made readable is the latest for every reader.
      while (pub.size() >= 2 && pub[1].at <= now) pub.pop_front();
      Replica::Peer& peer = rep.peers[q];
      if (!pub.empty() && pub.front().at <= now && pub.front().seq >= peer.covered) {
        peer.covered = pub.front().seq;
        peer.load = pub.front().load;
        peer.ended = pub.front().ended;
        std::erase_if(peer.since, [&](const auto& d) { return d.first <= peer.covered; });
      }
      for (std::size_t i = 0; i < peer.load.size(); ++i) parts[i].push_back({now, peer.load[i]});
      for (const auto& d : peer.since) parts[d.second.first].push_back(d.second.second);
    }
    // As the daemon's SharedState hands it on: per worker one queue, drained in the order its parts came.
    for (std::size_t i = 0; i < n_; ++i) {
      rep.remote[i] = policy::queued_at(std::move(parts[i]), now);
      rep.remote_at[i] = now;
      rep.others_ended[i] = 0;
      for (const auto& peer : rep.peers)
        if (i < peer.ended.size()) rep.others_ended[i] += peer.ended[i];
    }
  }

  // Replica `k`'s rates exchange (SharedState::exchange_rates): it writes the rates it learned, and seeds the
  // workers it has not measured yet with the latest the others wrote (RateLearner::seed).
  void exchange_rates(std::size_t k, double now) {
    Replica& rep = *reps_[k];
    rep.next_rates = now + std::max(o_.rates_interval_s, 1e-3);
    for (std::size_t i = 0; i < n_; ++i) {
      const policy::WorkerRates mine = rep.learner.rates(static_cast<WorkerId>(i));
      auto& board = rates_board_[i];
      while (board.size() >= 2 && board[1].first <= now) board.pop_front();
      if (!board.empty() && board.front().first <= now) rep.learner.seed(static_cast<WorkerId>(i), board.front().second);
      if (mine.prefill_samples > 0 || mine.decode_samples > 0) board.emplace_back(now + o_.sync_delay_s, mine);
    }
  }

  // Applies one KV event to every replica's index (each subscribes to the workers' events). With a CPU tier a
  // block can sit on both media while the index keeps one tier per (block, worker): it shows the GPU copy when
  // there is one, else the CPU copy.
  void apply(WorkerId w, Delivery::Kind kind, sim::Medium m, std::span<const std::uint64_t> h) {
    using hashing::Tier;
    const Tier tier = m == sim::Medium::kGpu ? Tier::kGpu : Tier::kCpu;
    auto* media = workers_[w].media.get();
    switch (kind) {
      case Delivery::kCleared:
        for (auto& rep : reps_) rep->index.clear_worker(w);
        if (media) media->clear();
        return;
      case Delivery::kStored:
        if (!media) {
          for (auto& rep : reps_) rep->index.store(w, h, tier);
          return;
        }
        for (std::uint64_t x : h) {
          std::uint8_t& bits = (*media)[x];
          bits |= static_cast<std::uint8_t>(1u << static_cast<int>(m));
          const std::uint64_t one[1] = {x};
          for (auto& rep : reps_) rep->index.store(w, one, (bits & 1u) ? Tier::kGpu : Tier::kCpu);
        }
        return;
      case Delivery::kRemoved:
        if (!media) {
          for (auto& rep : reps_) rep->index.remove(w, h);
          return;
        }
        for (std::uint64_t x : h) {
          auto it = media->find(x);
          if (it == media->end()) continue;
          it->second &= static_cast<std::uint8_t>(~(1u << static_cast<int>(m)));
          const std::uint64_t one[1] = {x};
          if (it->second == 0) {
            media->erase(it);
            for (auto& rep : reps_) rep->index.remove(w, one);
          } else if (m == sim::Medium::kGpu) {
            for (auto& rep : reps_) rep->index.store(w, one, Tier::kCpu);
          }
        }
        return;
    }
  }

  // Routes one arrival as the router replica `replica` sees the fleet.
  // `arrival`: when the request came (its TTFT counts from there); t: when it is routed (later when staggered).
  void route(const Request& r, double t, std::size_t replica, double arrival) {
    Replica& rep = *reps_[replica];
    // 1. The views the policy sees: router-tracked load (this replica's own, plus the others' as last read when
    //    they share it, as Router::route adds it), polled metrics, learned rates.
    for (std::size_t i = 0; i < n_; ++i) {
      const WorkerState& ws = workers_[i];
      const RouterLoad& l = rep.load[i];
      // A fresh view, as the daemon's Worker::view builds one: fields fill() leaves alone while this replica's
      // queue is empty must not keep the last request's values (add_to() would add the others' load onto them).
      policy::WorkerView& v = views_[i];
      v = policy::WorkerView{};
      v.id = static_cast<WorkerId>(i);
      v.healthy = true;
      v.in_flight = l.in_flight;
      v.pending_prefill_tokens = l.pending_prefill;
      l.prefill_queue.fill(v, t);
      v.active_decode_tokens = l.active_decode;
      v.inflight_kv_tokens = l.inflight_kv;
      if (sharing_) others_load(rep, i, t).add_to(v);
      v.running = ws.running;
      v.waiting = ws.waiting;
      policy::settle_report(v, l.ended + rep.others_ended[i], rep.ended_at_poll[i]);
      v.kv_usage = ws.kv_usage;
      v.capacity_blocks = gpu_blocks_;
      v.reused_blocks = uses_match_ ? rep.index.worker_reused_blocks(v.id) : 0;
      v.max_running = max_running_;
      rep.learner.apply(v);
    }
    // 2. Session binding.
    std::optional<std::size_t> preferred;
    if (r.session != 0) {
      auto it = rep.sessions.find(r.session);
      if (it != rep.sessions.end() && t - it->second.second <= o_.session_ttl_s) preferred = it->second.first;
    }
    // The live sessions bound to each worker, which kv_cost spreads new sessions over (the daemon counts its
    // bindings as they change; here they are counted when a session opens).
    if (r.session != 0 && !preferred) {
      for (const auto& [key, b] : rep.sessions)
        if (t - b.second <= o_.session_ttl_s) ++views_[b.first].sessions;
      for (std::size_t i = 0; i < n_; ++i) views_[i].session_opened_ago_s = t - rep.last_opened[i];
    }
    // 3. Match + pick, timed as the router's own decision cost.
    const auto t0 = std::chrono::steady_clock::now();
    policy::RoutingContext ctx;
    ctx.chain = &r.chain;
    ctx.tokens_per_block = kBlockTokens;
    ctx.prompt_tokens = r.prompt_tokens;
    ctx.max_tokens = r.output_tokens;
    ctx.workers = views_;
    if (uses_match_) {
      rep.index.match(r.chain.hashes, match_);
      ctx.match = &match_;
    }
    ctx.preferred = preferred;
    ctx.opens_session = r.session != 0 && !preferred;
    ctx.affinity_key = r.affinity_key;
    // As the daemon's: this replica's own count (one replica: the request's id), interleaved with the others'
    // when they share state (the daemon knows its rank among them only then).
    ctx.sequence = policy::replica_sequence(rep.sequence++, replica, sharing_ ? reps_.size() : 1);
    ctx.random = mix(o_.seed, r.id);
    ctx.session_context_tokens = rep.session_context.value();
    ctx.fleet_means = rep.latencies.means();
    if (preferred && uses_match_) rep.session_context.add(policy::own_context_tokens(ctx));
    const std::optional<policy::Pick> pick = policy_.pick(ctx);
    const auto t1 = std::chrono::steady_clock::now();
    decision_us_.push_back(static_cast<float>(std::chrono::duration<double, std::micro>(t1 - t0).count()));

    const std::size_t wi = pick ? pick->worker : 0;
    const auto w = static_cast<WorkerId>(wi);
    WorkerState& ws = workers_[wi];
    Flight& f = flights_[r.id];
    f.worker = w;
    f.replica = static_cast<std::uint32_t>(replica);
    f.arrival = arrival;
    const std::uint64_t predicted_cached = uses_match_ ? ctx.matched_tokens(wi) : 0;
    f.predicted_uncached = r.prompt_tokens - std::min<std::uint64_t>(r.prompt_tokens, predicted_cached);
    // As the daemon's Decision::queue_s: the pending prefill of the view the pick saw (the others' included).
    f.queue_est = policy::queued_prefill_seconds(views_[wi]);
    f.estimate = pick ? pick->estimate_s : 0.0;
    f.uncorrected_estimate = pick ? policy::uncorrected_ttft_estimate(*pick, views_[wi]) : 0.0;
    f.reported_estimate = pick ? policy::corrected_ttft_estimate(*pick, views_[wi]) : 0.0;
    f.itl_estimate = pick ? pick->itl_estimate_s : 0.0;
    if (!o_.dump_dir.empty()) f.view_at_dispatch = views_[wi];
    if (uses_match_ && !o_.dump_dir.empty())
      for (std::size_t i = 0; i < views_.size(); ++i) f.best_matched = std::max(f.best_matched, ctx.matched_tokens(i));
    f.bound = preferred ? static_cast<int>(*preferred) : -1;
    // The session is bound where the pick says: kv_cost may bind an opening to another worker than its first turn's
    // (policy::Pick::session_worker), which a warm-up may copy the prompt to.
    const std::size_t bound_to = pick && pick->session_worker ? *pick->session_worker : wi;
    if (r.session != 0) bind(rep, r.session, bound_to, t);

    // kv_cost's prefix hold, as the daemon does it (router/router.h, Router::route): in precise mode, a request
    // (not a session's later turn) whose matched prefix ends in a block an earlier request is still computing on
    // the chosen worker, and that no KV event has confirmed yet, waits for that request's first token, the block's
    // event, or --prefix-hold seconds; only where that prefix's prefill outlasts the worker's fixed part of TTFT,
    // and while the request could be admitted with the earlier one (policy::prefix_hold_pays). A request's
    // prefill starts once the prefill queued ahead of it is done, at the worker's rate.
    hashing::ComputingPrefixes::Token leader = 0;
    const std::uint32_t mb = holds_ ? ctx.matched_blocks(wi) : 0;
    if (mb > 0 && (r.session == 0 || ctx.opens_session) && rep.computing.holds_help(w) &&
        rep.index.tier(w, r.chain.hashes[mb - 1]) == hashing::Tier::kPredicted) {
      const auto computing = rep.computing.leader(w, mb - 1, r.chain.hashes[mb - 1]);
      if (computing && policy::prefix_hold_pays(views_[wi], static_cast<double>(ctx.matched_tokens(wi)),
                                                static_cast<double>(mb - computing->from) * ctx.tokens_per_block,
                                                t >= computing->starts_at))
        leader = computing->token;
    }
    if (holds_) f.computing = rep.computing.begin(w, r.chain.hashes, mb, t, t + policy::queued_prefill_seconds(views_[wi]));

    // 4. The observer's updates, then the request goes to the worker.
    record_chain(rep, w, r, mb);
    sim::SimRequest req;
    req.id = r.id;
    req.block_hashes.reserve(r.chain.hashes.size() + r.output_blocks.size());
    req.block_hashes.assign(r.chain.hashes.begin(), r.chain.hashes.end());
    req.block_hashes.insert(req.block_hashes.end(), r.output_blocks.begin(), r.output_blocks.end());
    req.prompt_tokens = r.prompt_tokens;
    req.max_tokens = r.output_tokens;
    if (leader != 0) {
      f.held = std::make_unique<sim::SimRequest>(std::move(req));
      ws.held.push_back({r.id, static_cast<std::uint32_t>(replica), t + o_.prefix_hold_s, r.chain.hashes[mb - 1], leader});
    } else if (!engines_[wi].submit(std::move(req), t)) {
      ++rejected_;
      rep.computing.end(w, f.computing);
      return;
    }
    f.submitted = true;
    count_sent(rep, replica, r.id, r, f, mb, bound_to == wi ? r.session : 0, r.output_tokens, t);
    ws.routed += 1;
    if (pick && pick->warm && *pick->warm != wi) warm_up(r, *pick->warm, ctx, replica, t, bound_to == *pick->warm ? r.session : 0);
    // A session bound where nothing of this request went: the others learn the binding alone (as the daemon's route()).
    if (sharing_ && r.session != 0 && bound_to != wi && !(pick && pick->warm == bound_to)) {
      StreamRecord rec{t + o_.sync_delay_s, static_cast<std::uint32_t>(replica), static_cast<WorkerId>(bound_to), r.id,
                       r.session, 0, 0, {}};
      rec.binding_only = true;
      stream_.push_back(rec);
    }
  }

  // A warm-up (policy::Pick::warm): request r's prompt sent to worker `wi` as well, for one output token. As the
  // daemon's: loaded and recorded as a routed request (the index predicts the copy there), not a user's request.
  // `session`: the session bound there, which the other replicas learn from its record (0: none).
  void warm_up(const Request& r, std::size_t wi, const policy::RoutingContext& ctx, std::size_t replica, double t,
               std::uint64_t session) {
    Replica& rep = *reps_[replica];
    const auto w = static_cast<WorkerId>(wi);
    const std::uint64_t id = kWarmIds + next_warm_++;
    Flight& f = warms_[id];
    f.source = r.id;
    f.worker = w;
    f.replica = static_cast<std::uint32_t>(replica);
    f.arrival = t;
    const std::uint64_t predicted_cached = uses_match_ ? ctx.matched_tokens(wi) : 0;
    f.predicted_uncached = r.prompt_tokens - std::min<std::uint64_t>(r.prompt_tokens, predicted_cached);
    const std::uint32_t mb = holds_ ? ctx.matched_blocks(wi) : 0;
    if (holds_) f.computing = rep.computing.begin(w, r.chain.hashes, mb, t, t + policy::queued_prefill_seconds(views_[wi]));
    record_chain(rep, w, r, mb);
    sim::SimRequest req;
    req.id = id;
    req.block_hashes.assign(r.chain.hashes.begin(), r.chain.hashes.end());
    req.prompt_tokens = r.prompt_tokens;
    req.max_tokens = 1;
    if (!engines_[wi].submit(std::move(req), t)) {
      rep.computing.end(w, f.computing);
      warms_.erase(id);
      return;
    }
    f.submitted = true;
    ++warm_ups_;
    count_sent(rep, replica, id, r, f, mb, session, /*max_tokens=*/1, t);
  }

  // The observer's record of request r's chain sent to worker w (`mb` blocks of it matched there, precise mode).
  void record_chain(Replica& rep, WorkerId w, const Request& r, std::uint32_t mb) {
    if (holds_) {
      // As the daemon's expect(): the blocks it computes are predicted until the worker's events store them.
      rep.index.record_routed(w, r.chain.hashes, mb);
    } else if (uses_match_) {
      // Approximate mode: the routing history is the index (capacity-bounded LRU per worker). Precise mode:
      // the engine's events are the truth, but they arrive only after the prefill (plus the event delay),
      // so the router also records what it just routed, as Dynamo's KV router tracks its in-flight blocks;
      // the events then confirm or remove those entries (no capacity bound: the engine reports evictions).
      rep.index.record(w, r.chain.hashes,
                       run_.mode == IndexMode::kPrecise ? hashing::Tier::kGpu : hashing::Tier::kPredicted);
    }
  }

  // What flight `id` (request r's prompt, on f.worker, for `max_tokens`) adds to the load replica `rep` counts there
  // (as backends::Worker::begin), and what the others learn of it (the daemon's SharedState::routed): approximate
  // mode the prediction, both modes the session it bound (`session`, 0: none); in precise mode every replica reads
  // the workers' events instead.
  void count_sent(Replica& rep, std::size_t replica, std::uint64_t id, const Request& r, Flight& f, std::uint32_t mb,
                  std::uint64_t session, std::uint32_t max_tokens, double t) {
    RouterLoad& l = rep.load[f.worker];
    const double prefill_s = policy::prefill_seconds(static_cast<double>(f.predicted_uncached),
                                                     static_cast<double>(r.prompt_tokens - f.predicted_uncached),
                                                     views_[f.worker].prefill_tokens_per_s);
    f.kv_tokens = f.predicted_uncached + policy::expected_output_tokens(max_tokens);
    if (sharing_) {
      stream_.push_back({t + o_.sync_delay_s, static_cast<std::uint32_t>(replica), f.worker, r.id, session, mb,
                         ++rep.routed_seq,
                         {.in_flight = 1, .pending_prefill_tokens = f.predicted_uncached, .pending_prefill_s = prefill_s,
                          .inflight_kv_tokens = f.kv_tokens}});
    }
    l.prefill_queue.add(id, prefill_s, t);
    l.in_flight += 1;
    l.inflight_kv += f.kv_tokens;
    l.pending_prefill += f.predicted_uncached;
  }

  // A held request the engine refused when it was released: undoes what routing it counted.
  void unsubmit(WorkerId w, std::uint64_t id, Flight& f, double t) {
    Replica& rep = *reps_[f.replica];
    RouterLoad& l = rep.load[w];
    l.prefill_queue.remove(id, /*first_token=*/false, t);
    ++rejected_;
    f.submitted = false;
    l.in_flight -= 1;
    l.inflight_kv -= std::min(l.inflight_kv, f.kv_tokens);
    l.pending_prefill -= std::min(l.pending_prefill, f.predicted_uncached);
    rep.computing.end(w, f.computing);
  }

  void dump() const {
    char scale[32];
    std::snprintf(scale, sizeof scale, "%g", o_.rate_scale);
    std::ofstream out(o_.dump_dir + "/" + run_.label + "@" + scale + ".csv");
    out << "id,arrival_s,prompt_tokens,output_tokens,worker,predicted_cached,cached,estimate_s,pending_tokens,"
           "in_flight,ttft_s,e2e_s,best_matched,bound,reported_estimate_s,kv_usage,running,waiting,inflight_kv_tokens,"
           "capacity_tokens\n";
    for (std::size_t i = 0; i < flights_.size(); ++i) {
      const Flight& f = flights_[i];
      const Request& r = w_.requests[i];
      if (!f.submitted || f.finish < 0) continue;
      out << i << ',' << f.arrival << ',' << r.prompt_tokens << ',' << r.output_tokens << ',' << f.worker << ','
          << (r.prompt_tokens - f.predicted_uncached) << ',' << f.cached << ',' << f.estimate << ','
          << f.view_at_dispatch.pending_prefill_tokens << ',' << f.view_at_dispatch.in_flight << ','
          << (f.first_token - f.arrival) << ','
          << (f.finish - f.arrival) << ',' << f.best_matched << ',' << f.bound << ',' << f.reported_estimate << ','
          << f.view_at_dispatch.kv_usage << ',' << f.view_at_dispatch.running << ',' << f.view_at_dispatch.waiting << ','
          << f.view_at_dispatch.inflight_kv_tokens << ','
          << f.view_at_dispatch.capacity_blocks * std::uint64_t{kBlockTokens} << '\n';
    }
  }

  PolicyResult summarize() {
    PolicyResult res;
    res.name = run_.label;
    res.mode = run_.mode;
    RequestTally tally;
    for (std::size_t i = 0; i < flights_.size(); ++i) {
      const Flight& f = flights_[i];
      const Request& r = w_.requests[i];
      if (!f.submitted || f.finish < 0) continue;
      tally.add(f.first_token - f.arrival, f.finish - f.arrival, f.finish - f.first_token, r.output_tokens, f.cached,
                r.prompt_tokens, r.output_tokens, f.arrival, f.finish);
      const double itl = r.output_tokens >= 2 ? (f.finish - f.first_token) / (r.output_tokens - 1) : 0.0;
      tally.add_estimate(f.first_token - f.arrival, f.reported_estimate, itl, f.itl_estimate);
    }
    res.output_tok_s_total = tally.fill(res);
    res.output_tok_s = last_arrival_ > first_arrival_
                           ? static_cast<double>(tokens_in_window_) / (last_arrival_ - first_arrival_)
                           : res.output_tok_s_total;
    std::vector<double> busy, routed;
    for (std::size_t e = 0; e < n_; ++e) {
      const sim::EngineStats s = engines_[e].stats();
      busy.push_back(s.busy_seconds);
      routed.push_back(static_cast<double>(workers_[e].routed));
      res.evicted_blocks += s.gpu_evictions + s.cpu_evictions;
      res.preemptions += s.preemptions;
    }
    res.load_cov = coefficient_of_variation(busy);
    res.requests_cov = coefficient_of_variation(routed);
    std::vector<double> d(decision_us_.begin(), decision_us_.end());
    std::sort(d.begin(), d.end());
    res.decision_us_p50 = percentile(d, 0.5);
    res.decision_us_p99 = percentile(d, 0.99);
    res.staggered = staggered_;
    res.warm_ups = warm_ups_;
    return res;
  }

  const Workload& w_;
  const PolicyRun& run_;
  const SimOptions& o_;
  const policy::RoutingPolicy& policy_;
  const std::size_t n_;
  std::vector<sim::Engine> engines_;
  std::vector<Sink> sinks_;
  std::vector<WorkerState> workers_;
  std::vector<policy::WorkerView> views_;
  std::vector<Flight> flights_;
  std::unordered_map<std::uint64_t, Flight> warms_;  // warm-ups in flight, by id (kWarmIds on)
  std::uint64_t next_warm_ = 0;
  std::uint64_t warm_ups_ = 0;
  std::vector<std::unique_ptr<Replica>> reps_;  // arrival i goes to reps_[i % size]
  std::uint64_t staggered_ = 0;                 // arrivals routed later, in turn (BurstStagger)
  bool sharing_ = false;                        // several replicas, sharing through "Redis"
  std::deque<StreamRecord> stream_;             // routed records not yet readable, in time order
  // The shared rates (the daemon's P:rates hash), by worker: (readable from, rates), oldest first.
  std::vector<std::deque<std::pair<double, policy::WorkerRates>>> rates_board_;
  hashing::PrefixIndex::Match match_;
  std::vector<float> decision_us_;
  std::uint64_t gpu_blocks_ = 0;
  std::uint32_t max_running_ = 256;
  bool cpu_tier_ = false;
  bool uses_match_ = false;
  bool holds_ = false;  // kv_cost in precise mode: prefix holds
  std::size_t rejected_ = 0;
  double first_arrival_ = 0;
  double last_arrival_ = 0;           // arrival time of the last request (scaled)
  std::uint64_t tokens_in_window_ = 0;  // output tokens produced up to last_arrival_
};

}  // namespace

Result<FleetCapacity> fleet_capacity(const SimOptions& options) {
  auto cfg = engine_config(options);
  if (!cfg) return cfg.error();
  sim::Engine e(*cfg);
  const sim::EngineStats s = e.stats();
  FleetCapacity c;
  c.gpu_blocks_per_worker = s.num_gpu_blocks;
  c.cpu_blocks_per_worker = s.num_cpu_blocks;
  c.unloaded_prefill_tokens_per_s = prior_rates(e).prefill_tokens_per_s;
  return c;
}

Result<PolicyResult> simulate(const Workload& workload, const PolicyRun& run, const SimOptions& options,
                              std::atomic<std::size_t>* progress) {
  if (options.workers == 0 || options.workers > 4096) return make_error("--workers must be between 1 and 4096");
  if (options.replicas == 0 || options.replicas > 256) return make_error("--replicas must be between 1 and 256");
  auto cfg = engine_config(options);
  if (!cfg) return cfg.error();
  auto policy = policy::make_policy(run.policy, options.policy);
  if (!policy) return policy.error();
  FleetSim sim(workload, run, options, **policy, *cfg);
  return sim.run(progress);
}

}  // namespace kvroute::bench
