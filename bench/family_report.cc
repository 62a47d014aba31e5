#include "bench/family_report.h"

#include <boost/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

#include "bench/report.h"
#include "bench/simulate.h"

namespace kvroute::bench {

bool FamilySeedResult::within(const FamilyMargins& m) const {
  return ttft_mean <= 1 + m.ttft_mean && ttft_p99 <= 1 + m.ttft_p99 && itl_mean <= 1 + m.itl_mean &&
         e2e_mean <= 1 + m.e2e_mean && throughput <= 1 + m.throughput;
}

namespace {

double num(const boost::json::object& o, const char* key) {
  const auto* v = o.if_contains(key);
  if (!v) return 0;
  if (v->is_double()) return v->as_double();
  if (v->is_int64()) return static_cast<double>(v->as_int64());
  if (v->is_uint64()) return static_cast<double>(v->as_uint64());
  return 0;
}

struct Merged {
  std::string description;
  double capacity_bound = 0;
  std::map<std::string, boost::json::object> policies;
};

// kv_cost's ratio to the best other policy on one figure; `higher_better` flips it so above 1 is worse.
double ratio(const Merged& m, const char* key, bool higher_better, std::string& best_name) {
  const double kv = num(m.policies.at("kv_cost"), key);
  double best = higher_better ? -1 : INFINITY;
  for (const auto& [name, p] : m.policies) {
    if (name == "kv_cost") continue;
    const double v = num(p, key);
    if (higher_better ? v > best : v < best) {
      best = v;
      best_name = name;
    }
  }
  if (higher_better) return kv > 0 ? best / kv : INFINITY;
  return best > 0 ? kv / best : (kv > 0 ? INFINITY : 1.0);
}

std::string pct(double r) {
  char b[32];
  std::snprintf(b, sizeof b, "%+.1f%%", 100 * (r - 1));
  return b;
}

}  // namespace

Result<std::vector<FamilySeedResult>> read_family_results(const std::vector<std::string>& files) {
  std::map<std::string, Merged> by_workload;
  std::vector<std::string> order;
  for (const auto& f : files) {
    std::ifstream in(f);
    if (!in) return make_error("cannot read " + f);
    std::stringstream ss;
    ss << in.rdbuf();
    boost::system::error_code ec;
    boost::json::value v = boost::json::parse(ss.str(), ec);
    if (ec || !v.is_object()) return make_error(f + ": not a JSON document of kvroute-bench simulate");
    const auto& o = v.as_object();
    const auto* w = o.if_contains("workload");
    const auto* ps = o.if_contains("policies");
    if (!w || !w->is_string() || !ps || !ps->is_array()) return make_error(f + ": no workload or policies");
    const std::string name(w->as_string());
    if (!by_workload.count(name)) order.push_back(name);
    Merged& m = by_workload[name];
    if (const auto* d = o.if_contains("description"); d && d->is_string()) m.description = d->as_string();
    m.capacity_bound = num(o, "capacity_bound_hit_rate");
    for (const auto& p : ps->as_array()) {
      if (!p.is_object() || !p.as_object().if_contains("name")) continue;
      m.policies[std::string(p.as_object().at("name").as_string())] = p.as_object();
    }
  }
  std::vector<FamilySeedResult> out;
  for (const auto& name : order) {
    const Merged& m = by_workload[name];
    if (!m.policies.count("kv_cost") || m.policies.size() < 2) continue;
    FamilySeedResult r;
    r.workload = name;
    r.description = m.description;
    r.ttft_mean = ratio(m, "ttft_mean_s", false, r.best_ttft_mean);
    r.ttft_p99 = ratio(m, "ttft_p99_s", false, r.best_ttft_p99);
    r.itl_mean = ratio(m, "itl_mean_s", false, r.best_itl_mean);
    r.e2e_mean = ratio(m, "e2e_mean_s", false, r.best_e2e_mean);
    r.throughput = ratio(m, "output_tok_s", true, r.best_throughput);
    const auto& kv = m.policies.at("kv_cost");
    r.hit_rate = num(kv, "hit_rate");
    r.capacity_bound = m.capacity_bound;
    for (const auto& [n, p] : m.policies) r.some_policy_unsaturated |= num(p, "ttft_mean_s") < 1.0;
    if (const auto* c = kv.if_contains("calibration"); c && c->is_object()) {
      r.calib_ttft_median = num(c->as_object(), "ttft_median_abs_err");
      r.calib_ttft_p90 = num(c->as_object(), "ttft_p90_abs_err");
      r.calib_itl_median = num(c->as_object(), "itl_median_abs_err");
      r.calib_itl_p90 = num(c->as_object(), "itl_p90_abs_err");
    }
    out.push_back(std::move(r));
  }
  if (out.empty()) return make_error("no workload with kv_cost and another policy in the given files");
  return out;
}

std::string family_markdown(const std::vector<FamilySeedResult>& seeds, const FamilyMargins& mg) {
  std::ostringstream o;
  o << "kv_cost against the best other policy per figure (+: kv_cost worse; throughput: best / kv_cost).\n\n"
    << "| workload | draw | mean TTFT | p99 TTFT | mean ITL | mean e2e | throughput | hit / capacity bound | "
       "calibration TTFT med / p90 | within |\n|---|---|---|---|---|---|---|---|---|---|\n";
  std::size_t pass = 0, hit_ok = 0, hit_applies = 0;
  double worst[5] = {0, 0, 0, 0, 0};
  std::vector<double> med, p90, imed, ip90;
  for (const auto& s : seeds) {
    const bool ok = s.within(mg);
    pass += ok;
    const double rs[5] = {s.ttft_mean, s.ttft_p99, s.itl_mean, s.e2e_mean, s.throughput};
    for (int k = 0; k < 5; ++k) worst[k] = std::max(worst[k], rs[k]);
    const double hit_share = s.capacity_bound > 0 ? s.hit_rate / s.capacity_bound : 1.0;
    if (s.some_policy_unsaturated) {
      ++hit_applies;
      hit_ok += hit_share >= 0.9;
    }
    med.push_back(s.calib_ttft_median);
    p90.push_back(s.calib_ttft_p90);
    imed.push_back(s.calib_itl_median);
    ip90.push_back(s.calib_itl_p90);
    char hit[48], cal[48];
    std::snprintf(hit, sizeof hit, "%.1f / %.1f %%", 100 * s.hit_rate, 100 * s.capacity_bound);
    std::snprintf(cal, sizeof cal, "%.0f / %.0f %%", 100 * s.calib_ttft_median, 100 * s.calib_ttft_p90);
    std::string draw = s.description;
    if (draw.rfind("family ", 0) == 0) draw = draw.substr(7);
    o << "| " << s.workload << " | " << draw << " | " << pct(s.ttft_mean) << " (" << s.best_ttft_mean << ") | "
      << pct(s.ttft_p99) << " (" << s.best_ttft_p99 << ") | " << pct(s.itl_mean) << " (" << s.best_itl_mean << ") | "
      << pct(s.e2e_mean) << " (" << s.best_e2e_mean << ") | " << pct(s.throughput) << " (" << s.best_throughput
      << ") | " << hit << " | " << cal << " | " << (ok ? "yes" : "no") << " |\n";
  }
  auto median = [](std::vector<double> v) { return stats_of(std::move(v)).p50; };
  char line[512];
  std::snprintf(line, sizeof line,
                "\nWithin every margin (mean TTFT %.0f %%, p99 TTFT %.0f %%, mean ITL %.0f %%, mean e2e %.0f %%, "
                "throughput %.0f %%): %zu of %zu seeds.\nWorst ratio per figure: mean TTFT %s, p99 TTFT %s, mean ITL "
                "%s, mean e2e %s, throughput %s.\nHit rate at least 90 %% of the capacity bound: %zu of the %zu seeds "
                "where some policy kept mean TTFT under 1 s.\nCalibration of kv_cost's TTFT estimate, median over the "
                "seeds: median |obs/est - 1| %.1f %%, p90 %.1f %%; ITL: %.1f %%, %.1f %%.\n",
                100 * mg.ttft_mean, 100 * mg.ttft_p99, 100 * mg.itl_mean, 100 * mg.e2e_mean, 100 * mg.throughput, pass,
                seeds.size(), pct(worst[0]).c_str(), pct(worst[1]).c_str(), pct(worst[2]).c_str(),
                pct(worst[3]).c_str(), pct(worst[4]).c_str(), hit_ok, hit_applies, 100 * median(med),
                100 * median(p90), 100 * median(imed), 100 * median(ip90));
  o << line;
  return o.str();
}

std::string family_svg(const std::vector<FamilySeedResult>& seeds) {
  const char* names[5] = {"mean TTFT", "p99 TTFT", "mean ITL", "mean e2e", "throughput (best / kv_cost)"};
  std::vector<Series> series;
  for (int k = 0; k < 5; ++k) {
    std::vector<double> v;
    for (const auto& s : seeds) {
      const double rs[5] = {s.ttft_mean, s.ttft_p99, s.itl_mean, s.e2e_mean, s.throughput};
      v.push_back(std::min(rs[k], 3.0));  // the chart is read near 1; the table has the exact values
    }
    std::sort(v.begin(), v.end());
    Series s{names[k], {}};
    for (std::size_t i = 0; i < v.size(); ++i) s.points.emplace_back(static_cast<double>(i + 1), v[i]);
    series.push_back(std::move(s));
  }
  series.push_back(Series{"parity (1.0)", {{1.0, 1.0}, {static_cast<double>(seeds.size()), 1.0}}});
  return svg_line_chart("kv_cost / best other policy over the workload family (" + std::to_string(seeds.size()) +
                            " seeds, each figure sorted; capped at 3)",
                        "seeds, sorted per figure", "ratio (above 1: kv_cost worse)", series, false);
}

int run_family_summary_command(const std::vector<std::string>& args) {
  std::string out_dir;
  std::vector<std::string> files;
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--help" || args[i] == "-h") {
      std::cout << "usage: kvroute-bench family-summary --out DIR FILE.json...\n"
                   "Judges kv_cost against the best other policy per figure over family seeds; writes\n"
                   "DIR/family.md and DIR/family_ratios.svg and prints the table.\n";
      return 0;
    }
    if (args[i] == "--out" && i + 1 < args.size()) out_dir = args[++i];
    else files.push_back(args[i]);
  }
  if (out_dir.empty() || files.empty()) {
    std::cerr << "kvroute-bench family-summary: give --out DIR and at least one JSON file (see --help)\n";
    return 2;
  }
  auto seeds = read_family_results(files);
  if (!seeds) {
    std::cerr << "kvroute-bench family-summary: " << seeds.error().message << "\n";
    return 1;
  }
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  const std::string md = family_markdown(*seeds, FamilyMargins{});
  std::ofstream(out_dir + "/family.md") << md;
  std::ofstream svg(out_dir + "/family_ratios.svg");
  svg << family_svg(*seeds);
  if (!svg) {
    std::cerr << "kvroute-bench family-summary: cannot write in " << out_dir << "\n";
    return 1;
  }
  std::cout << md;
  return 0;
}

}  // namespace kvroute::bench
