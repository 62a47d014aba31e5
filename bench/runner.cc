#include "bench/runner.h"

#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <mutex>
#include <optional>
#include <thread>

#include "bench/bounds.h"
#include "bench/family.h"
#include "bench/generators.h"
#include "bench/mooncake.h"
#include "util/split.h"

namespace kvroute::bench {

Result<double> parse_double(const std::string& flag, const std::string& v, double min) {
  char* end = nullptr;
  const double d = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !std::isfinite(d) || d < min)
    return make_error(flag + ": '" + v + "' is not a number >= " + std::to_string(min));
  return d;
}

Result<std::uint64_t> parse_count(const std::string& flag, const std::string& v) {
  std::uint64_t n = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (v.empty() || ec != std::errc() || p != v.data() + v.size())
    return make_error(flag + ": '" + v + "' is not a non-negative integer");
  return n;
}

namespace {

// The non-empty items of a comma list ("a,,b," names two).
std::vector<std::string> list_items(const std::string& s) {
  std::vector<std::string> out;
  for (std::string_view item : split(s, ','))
    if (!item.empty()) out.emplace_back(item);
  return out;
}

}  // namespace

std::string simulate_usage() {
  std::string gens;
  for (const auto& g : generator_names()) gens += (gens.empty() ? "" : ", ") + g;
  std::string pols;
  for (const auto& p : policy::policy_names()) pols += (pols.empty() ? "" : ",") + p;
  return "usage: kvroute-bench simulate (--trace FILE | --workload NAME) [options]\n"
         "\n"
         "Replays arrivals through N simulated workers and the router's real index and policy code, in virtual\n"
         "time, once per policy on identical arrivals, and prints the policies side by side.\n"
         "\n"
         "  --trace FILE            Mooncake-format trace (JSON lines: timestamp ms, input_length, output_length,\n"
         "                          hash_ids, optional session_id)\n"
         "  --workload NAME         built-in generator: " + gens + ",\n"
         "                          or family: one workload drawn at random by --seed (bench/family.h; the draw is\n"
         "                          printed above the table)\n"
         "  --workers N             fleet size (default 8)\n"
         "  --model NAME            model profile (default qwen3-8b)\n"
         "  --gpu NAME              GPU profile (default h100-80gb)\n"
         "  --cpu-tier-gb X         CPU KV tier per worker in GB (default 0: none)\n"
         "  --prefix-commit WHEN    when a step's computed blocks become prefix-cache hits on the workers:\n"
         "                          step-end (default, as SGLang) or schedule (as vLLM v1)\n"
         "  --rate-scale X          divide arrival times by X (X > 1: higher request rate; default 1)\n"
         "  --sweep a,b,c           run every policy at each of these rate scales\n"
         "  --knee F                find the rate scale where round_robin's mean TTFT is F x its unloaded TTFT\n"
         "                          (unloaded = at --knee-unloaded X, default 0.01) and sweep 0.75, 1, 1.25 x it\n"
         "  --seed N                seed of generators and random choices (default 1)\n"
         "  --policies a,b,...      policies to compare (default all: " + pols + ")\n"
         "  --mode M                index mode of prefix-aware policies: native (default: each as in its original\n"
         "                          system, kv_cost precise), approximate, precise, or both\n"
         "  --max-requests N        only the first N requests\n"
         "  --metrics-interval S    worker metrics (running, waiting, KV usage) polled every S virtual seconds\n"
         "                          (default 0.5; 0 = always fresh)\n"
         "  --event-delay S         KV events reach the router's index S seconds late (default 0.05)\n"
         "  --session-ttl S         idle seconds before a session binding expires (default 600)\n"
         "  --kv-alpha X, --kv-beta X  kv_cost weight of eviction, share of decode the running requests overlap\n"
         "  --session-margin S      off a worker whose KV pool is full, move a session only if S seconds are gained\n"
         "                          (default 0.25)\n"
         "  --prefix-hold S         kv_cost (precise mode) holds a request whose prefix an earlier one is still\n"
         "                          computing on its worker for at most S seconds, as the daemon (default 0.4; 0: never)\n"
         "  --replicas N            router replicas (default 1): arrivals go to them round-robin, each with its own\n"
         "                          index, session bindings, in-flight view and learned rates\n"
         "  --sharing none|redis    what the replicas share (default none): redis = as --shared-state does (each\n"
         "                          routed request's chain, session and load; published load; learned rates)\n"
         "  --sync-delay S          a shared record reaches the other replicas S seconds late (default 0.002)\n"
         "  --sync-interval S       each replica publishes and reads the load every S seconds (default 0.025,\n"
         "                          the daemon's --shared-state-interval)\n"
         "  --stagger on|off        sharing replicas take turns on requests that reach them at once (default on,\n"
         "                          the daemon's --shared-state-stagger; policy/burst_stagger.h)\n"
         "  --threads N             policies simulated in parallel (default 2)\n"
         "  --json FILE             write results as JSON\n"
         "  --plots DIR             write SVG plots (TTFT CDF; with --sweep, hit rate and p99 TTFT vs load)\n"
         "  --no-progress           no progress line on stderr\n"
         "  --dump-requests DIR     debug: one CSV per policy run with every request's routing and latency\n";
}

Result<BenchConfig> parse_simulate_args(const std::vector<std::string>& args) {
  BenchConfig c;
  c.policies = policy::policy_names();
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") return make_error(simulate_usage());
    if (a == "--no-progress") {
      c.progress = false;
      continue;
    }
    if (i + 1 >= args.size()) return make_error(a + " needs a value (see --help)");
    const std::string& v = args[++i];
    if (a == "--trace") c.trace = v;
    else if (a == "--workload") c.workload = v;
    else if (a == "--model") c.sim.model = v;
    else if (a == "--gpu") c.sim.gpu = v;
    else if (a == "--policies") c.policies = list_items(v);
    else if (a == "--json") c.json_path = v;
    else if (a == "--plots") c.plots_dir = v;
    else if (a == "--dump-requests") c.sim.dump_dir = v;
    else if (a == "--prefix-commit") {
      auto p = sim::parse_prefix_commit(v);
      if (!p) return make_error("--prefix-commit: " + p.error().message);
      c.sim.prefix_commit = *p;
    }
    else if (a == "--mode") {
      auto m = parse_mode(v);
      if (!m) return m.error();
      c.mode = *m;
    } else if (a == "--sharing") {
      auto m = parse_sharing(v);
      if (!m) return m.error();
      c.sim.sharing = *m;
    } else if (a == "--stagger") {
      if (v != "on" && v != "off") return make_error("--stagger: expected on or off, got '" + v + "'");
      c.sim.stagger = v == "on";
    } else if (a == "--sweep") {
      for (const auto& s : list_items(v)) {
        auto d = parse_double("--sweep", s, 1e-9);
        if (!d) return d.error();
        c.sweep.push_back(*d);
      }
    } else {
      Result<double> d = 0.0;
      if (a == "--workers" || a == "--seed" || a == "--max-requests" || a == "--threads" || a == "--replicas") {
        auto n = parse_count(a, v);
        if (!n) return n.error();
        if (a == "--workers") {
          if (*n == 0 || *n > 4096) return make_error("--workers must be between 1 and 4096");
          c.sim.workers = *n;
        } else if (a == "--seed") c.sim.seed = *n;
        else if (a == "--max-requests") c.max_requests = *n;
        else if (a == "--replicas") {
          if (*n == 0 || *n > 256) return make_error("--replicas must be between 1 and 256");
          c.sim.replicas = *n;
        }
        else c.threads = static_cast<unsigned>(std::max<std::uint64_t>(*n, 1));
        continue;
      }
      if (a == "--rate-scale") d = parse_double(a, v, 1e-9);
      else if (a == "--metrics-interval" || a == "--event-delay" || a == "--session-ttl" || a == "--cpu-tier-gb" ||
               a == "--kv-alpha" || a == "--kv-beta" || a == "--session-margin" || a == "--prefix-hold" || a == "--knee" ||
               a == "--knee-unloaded" || a == "--sync-delay" || a == "--sync-interval")
        d = parse_double(a, v, 0);
      else return make_error("unknown option '" + a + "' (see --help)");
      if (!d) return d.error();
      if (a == "--rate-scale") c.sim.rate_scale = *d;
      else if (a == "--metrics-interval") c.sim.metrics_interval_s = *d;
      else if (a == "--event-delay") c.sim.event_delay_s = *d;
      else if (a == "--session-ttl") c.sim.session_ttl_s = *d;
      else if (a == "--kv-alpha") c.sim.policy.alpha = *d;
      else if (a == "--knee") c.knee_factor = *d;
      else if (a == "--knee-unloaded") c.knee_unloaded_scale = std::max(*d, 1e-6);
      else if (a == "--kv-beta") c.sim.policy.beta = *d;
      else if (a == "--session-margin") c.sim.policy.session_margin_s = *d;
      else if (a == "--prefix-hold") c.sim.prefix_hold_s = *d;
      else if (a == "--sync-delay") c.sim.sync_delay_s = *d;
      else if (a == "--sync-interval") c.sim.load_interval_s = std::max(*d, 1e-3);
      else c.sim.cpu_tier_gb = *d;
    }
  }
  if (c.trace.empty() == c.workload.empty()) return make_error("give exactly one of --trace FILE or --workload NAME");
  if (c.policies.empty()) return make_error("--policies: no policy named");
  auto runs = plan_runs(c.policies, c.mode);
  if (!runs) return runs.error();
  return c;
}

Result<Workload> load_workload(const BenchConfig& c) {
  if (!c.trace.empty()) return read_mooncake_trace(c.trace, MooncakeOptions{c.sim.model, c.max_requests});
  if (c.workload == "family") {
    auto cfg = sim::EngineConfig::make(c.sim.model, c.sim.gpu);
    if (!cfg) return cfg.error();
    FamilyDraw d = draw_family(c.sim.seed);
    if (c.max_requests > 0) d.requests = c.max_requests;
    return generate_family(d, FamilyFleet{c.sim.workers, *cfg, c.sim.model});
  }
  GeneratorOptions g;
  g.seed = c.sim.seed;
  g.requests = c.max_requests;
  g.model = c.sim.model;
  return generate_workload(c.workload, g);
}

Result<Knee> find_knee(const Workload& workload, const BenchConfig& config, double factor) {
  BenchConfig c = config;
  c.policies = {"round_robin"};
  c.mode = ModeChoice::kNative;
  c.threads = 1;
  auto mean_ttft = [&](double scale) -> Result<double> {
    SimOptions o = c.sim;
    o.rate_scale = scale;
    // Stretching time must not expire sessions that would stay bound at the trace's own pace.
    o.session_ttl_s = c.sim.session_ttl_s / std::min(scale, 1.0);
    auto r = simulate(workload, PolicyRun{"round_robin", IndexMode::kNone, "round_robin"}, o);
    if (!r) return r.error();
    return r->ttft.mean;
  };
  Knee k;
  auto u = mean_ttft(c.knee_unloaded_scale);
  if (!u) return u.error();
  k.unloaded_ttft_s = *u;
  const double target = factor * *u;
  // Bracket [lo, hi] with ttft(lo) < target <= ttft(hi), then bisect geometrically to ~2 %.
  double lo = 0, hi = 1;
  for (int i = 0; i < 40; ++i) {
    auto t = mean_ttft(hi);
    if (!t) return t.error();
    if (*t >= target) break;
    lo = hi;
    hi *= 2;
  }
  if (lo == 0) {
    lo = hi / 2;
    for (int i = 0; i < 40; ++i) {
      auto t = mean_ttft(lo);
      if (!t) return t.error();
      if (*t < target) break;
      hi = lo;
      lo /= 2;
    }
  }
  while (hi / lo > 1.02) {
    const double mid = std::sqrt(lo * hi);
    auto t = mean_ttft(mid);
    if (!t) return t.error();
    (*t >= target ? hi : lo) = mid;
  }
  // Report a round number (3 significant digits) at or just above the knee.
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", hi);
  k.scale = std::strtod(buf, nullptr);
  return k;
}

Result<Bounds> compute_bounds(const Workload& workload, const SimOptions& options) {
  auto cap = fleet_capacity(options);
  if (!cap) return cap.error();
  Bounds b;
  b.upper = upper_bound_hit_rate(workload);
  b.capacity = capacity_bound_hit_rate(
      workload, options.workers * (cap->gpu_blocks_per_worker + cap->cpu_blocks_per_worker));
  return b;
}

Result<RunReport> run_policies(const Workload& workload, const BenchConfig& config, double rate_scale,
                               const std::function<void(const std::string&)>& progress_line) {
  auto runs = plan_runs(config.policies, config.mode);
  if (!runs) return runs.error();
  SimOptions o = config.sim;
  o.rate_scale = rate_scale;
  const std::size_t n = runs->size();
  std::vector<std::optional<Result<PolicyResult>>> results(n);
  std::vector<std::atomic<std::size_t>> routed(n);
  std::vector<std::atomic<bool>> done(n);
  for (auto& d : done) d = false;
  std::atomic<std::size_t> next{0};
  auto worker = [&] {
    for (std::size_t k; (k = next.fetch_add(1)) < n;) {
      results[k] = simulate(workload, (*runs)[k], o, &routed[k]);
      done[k] = true;
    }
  };
  const unsigned threads = std::max(1u, std::min<unsigned>(config.threads, static_cast<unsigned>(n)));
  std::vector<std::thread> pool;
  // Without a progress line the calling thread is one of the workers; with one, it only reports.
  for (unsigned t = progress_line ? 0 : 1; t < threads; ++t) pool.emplace_back(worker);
  if (progress_line) {
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      std::size_t finished = 0;
      std::string active;
      for (std::size_t k = 0; k < n; ++k) {
        if (done[k]) { ++finished; continue; }
        const std::size_t r = routed[k].load();
        if (r > 0 && !workload.requests.empty())
          active += " " + (*runs)[k].label + " " + std::to_string(100 * r / workload.requests.size()) + "%";
      }
      const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      char head[160];
      std::snprintf(head, sizeof head, "[simulate] %s x%g: %zu/%zu policies done, %.0fs;", workload.name.c_str(),
                    rate_scale, finished, n, el);
      progress_line(head + active);
      if (finished == n) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
  } else if (threads >= 1) {
    worker();
  }
  for (auto& t : pool) t.join();

  auto bounds = compute_bounds(workload, o);
  if (!bounds) return bounds.error();
  RunReport rep;
  rep.workload = workload.name;
  rep.workers = o.workers;
  rep.replicas = o.replicas;
  rep.sharing = o.sharing == Sharing::kRedis ? "redis" : "none";
  rep.rate_scale = rate_scale;
  rep.description = workload.description;
  rep.upper_bound_hit_rate = bounds->upper;
  rep.capacity_bound_hit_rate = bounds->capacity;
  for (auto& r : results) {
    if (!*r) return r->error();
    rep.policies.push_back(std::move(r->value()));
  }
  return rep;
}

int report_args_error(std::string_view command, const Error& error) {
  if (error.message.rfind("usage:", 0) == 0) {
    std::cout << error.message;
    return 0;
  }
  std::cerr << command << ": " << error.message << "\n";
  return 2;
}

int report_workload_error(std::string_view command, const Result<Workload>& workload) {
  if (!workload) {
    std::cerr << command << ": " << workload.error().message << "\n";
    return 1;
  }
  if (workload->requests.empty()) {
    std::cerr << command << ": the workload has no requests\n";
    return 1;
  }
  return 0;
}

int run_simulate_command(const std::vector<std::string>& args) {
  auto config = parse_simulate_args(args);
  if (!config) return report_args_error("kvroute-bench simulate", config.error());
  auto workload = load_workload(*config);
  if (int rc = report_workload_error("kvroute-bench simulate", workload)) return rc;
  if (!workload->description.empty()) std::cerr << "[simulate] " << workload->description << "\n";
  std::cerr << "[simulate] " << workload->name << ": " << workload->requests.size() << " requests, "
            << workload->prompt_tokens() << " prompt tokens, " << workload->duration_s() << " s\n";
  std::vector<double> scales = config->sweep.empty() ? std::vector<double>{config->sim.rate_scale} : config->sweep;
  Knee knee;
  if (config->knee_factor > 0) {
    auto k = find_knee(*workload, *config, config->knee_factor);
    if (!k) {
      std::cerr << "kvroute-bench simulate: " << k.error().message << "\n";
      return 1;
    }
    knee = *k;
    std::cerr << "[simulate] round_robin unloaded mean TTFT " << knee.unloaded_ttft_s << " s (rate scale "
              << config->knee_unloaded_scale << "); mean TTFT >= " << config->knee_factor << " x that from rate scale "
              << knee.scale << "\n";
    if (config->sweep.empty()) {
      char a[32], b[32];
      std::snprintf(a, sizeof a, "%.3g", 0.75 * knee.scale);
      std::snprintf(b, sizeof b, "%.3g", 1.25 * knee.scale);
      scales = {std::strtod(a, nullptr), knee.scale, std::strtod(b, nullptr)};
    }
  }
  std::vector<RunReport> reports;
  const auto start = std::chrono::steady_clock::now();
  std::function<void(const std::string&)> progress;
  if (config->progress)
    progress = [](const std::string& line) { std::cerr << "\r\033[K" << line.substr(0, 200) << std::flush; };
  for (double s : scales) {
    auto rep = run_policies(*workload, *config, s, progress);
    if (config->progress) std::cerr << "\n";
    if (!rep) {
      std::cerr << "kvroute-bench simulate: " << rep.error().message << "\n";
      return 1;
    }
    rep->knee_rate_scale = knee.scale;
    rep->round_robin_unloaded_ttft_s = knee.unloaded_ttft_s;
    std::cout << format_table(*rep) << "\n" << std::flush;
    reports.push_back(std::move(*rep));
  }
  const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cerr << "[simulate] finished in " << el << " s\n";
  if (!config->json_path.empty()) {
    std::ofstream f(config->json_path);
    f << to_json(reports);
    if (!f) {
      std::cerr << "kvroute-bench simulate: cannot write " << config->json_path << "\n";
      return 1;
    }
  }
  if (!config->plots_dir.empty()) {
    auto w = write_plots(config->plots_dir, reports);
    if (!w) {
      std::cerr << "kvroute-bench simulate: " << w.error().message << "\n";
      return 1;
    }
  }
  return 0;
}

}  // namespace kvroute::bench
