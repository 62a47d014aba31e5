#include "bench/report.h"

#include <boost/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace kvroute::bench {
namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

const char* mode_name(IndexMode m) {
  switch (m) {
    case IndexMode::kNone: return "none";
    case IndexMode::kApproximate: return "approximate";
    case IndexMode::kPrecise: return "precise";
  }
  return "none";
}

boost::json::object report_json(const RunReport& r) {
  boost::json::object o;
  o["workload"] = r.workload;
  if (!r.description.empty()) o["description"] = r.description;
  o["workers"] = r.workers;
  if (r.replicas > 1) {
    o["replicas"] = r.replicas;
    o["sharing"] = r.sharing;
  }
  o["rate_scale"] = r.rate_scale;
  o["upper_bound_hit_rate"] = r.upper_bound_hit_rate;
  o["capacity_bound_hit_rate"] = r.capacity_bound_hit_rate;
  if (r.knee_rate_scale > 0) {
    o["knee_rate_scale"] = r.knee_rate_scale;
    o["round_robin_unloaded_ttft_s"] = r.round_robin_unloaded_ttft_s;
  }
  boost::json::array ps;
  for (const PolicyResult& p : r.policies) {
    boost::json::object x;
    x["name"] = p.name;
    x["hit_rate"] = p.hit_rate;
    x["ttft_mean_s"] = p.ttft.mean;
    x["ttft_p50_s"] = p.ttft.p50;
    x["ttft_p90_s"] = p.ttft.p90;
    x["ttft_p99_s"] = p.ttft.p99;
    x["itl_mean_s"] = p.itl_mean_s;
    x["itl_p99_s"] = p.itl_p99_s;
    x["e2e_mean_s"] = p.e2e_mean_s;
    x["e2e_p99_s"] = p.e2e_p99_s;
    if (p.calibration.ttft_count > 0 || p.calibration.itl_count > 0) {
      const auto& c = p.calibration;
      x["calibration"] = {{"ttft_median_abs_err", c.ttft_median}, {"ttft_p90_abs_err", c.ttft_p90},
                          {"ttft_count", c.ttft_count},           {"itl_median_abs_err", c.itl_median},
                          {"itl_p90_abs_err", c.itl_p90},         {"itl_count", c.itl_count}};
    }
    x["output_tok_s"] = p.output_tok_s;
    x["completed"] = p.completed;
    x["load_cov"] = p.load_cov;
    x["evicted_blocks"] = p.evicted_blocks;
    x["decision_us_p50"] = p.decision_us_p50;
    x["staggered_requests"] = p.staggered;
    x["warm_ups"] = p.warm_ups;
    x["mode"] = mode_name(p.mode);
    x["output_tok_s_total"] = p.output_tok_s_total;
    x["ttft_cold_mean_s"] = p.ttft_cold.mean;
    x["ttft_warm_mean_s"] = p.ttft_warm.mean;
    x["cold_requests"] = p.ttft_cold.count;
    x["warm_requests"] = p.ttft_warm.count;
    x["requests_cov"] = p.requests_cov;
    x["preemptions"] = p.preemptions;
    x["decision_us_p99"] = p.decision_us_p99;
    ps.push_back(std::move(x));
  }
  o["policies"] = std::move(ps);
  return o;
}

}  // namespace

std::string format_table(const RunReport& r) {
  std::ostringstream out;
  if (!r.description.empty()) out << r.description << "\n";
  out << "workload " << r.workload << ", " << r.workers << " workers, ";
  if (r.replicas > 1) out << r.replicas << " router replicas sharing " << r.sharing << ", ";
  out << "rate scale " << fmt("%g", r.rate_scale)
      << ": upper bound hit rate " << fmt("%.1f%%", 100 * r.upper_bound_hit_rate) << ", capacity bound "
      << fmt("%.1f%%", 100 * r.capacity_bound_hit_rate) << "\n";
  char line[512];
  std::snprintf(line, sizeof line, "%-24s %6s %8s %8s %8s %8s %8s %7s %7s %8s %8s %9s %6s %6s %10s %8s\n",
                "policy", "hit%", "ttft", "p50", "p90", "p99", "cold", "itl_ms", "itl_p99", "e2e", "e2e_p99",
                "out_tok/s", "done", "cov", "evicted", "dec_us");
  out << line;
  for (const PolicyResult& p : r.policies) {
    std::snprintf(line, sizeof line,
                  "%-24s %6.1f %8.3f %8.3f %8.3f %8.3f %8.3f %7.2f %7.2f %8.2f %8.2f %9.0f %6zu %6.2f %10llu %8.1f\n",
                  p.name.c_str(), 100 * p.hit_rate, p.ttft.mean, p.ttft.p50, p.ttft.p90, p.ttft.p99, p.ttft_cold.mean,
                  1000 * p.itl_mean_s, 1000 * p.itl_p99_s, p.e2e_mean_s, p.e2e_p99_s, p.output_tok_s, p.completed,
                  p.load_cov, static_cast<unsigned long long>(p.evicted_blocks), p.decision_us_p50);
    out << line;
  }
  for (const PolicyResult& p : r.policies) {
    const auto& c = p.calibration;
    if (c.ttft_count == 0) continue;
    std::snprintf(line, sizeof line,
                  "calibration %s: |observed/estimated - 1| TTFT median %.1f%% p90 %.1f%% (%zu requests), "
                  "ITL median %.1f%% p90 %.1f%% (%zu)\n",
                  p.name.c_str(), 100 * c.ttft_median, 100 * c.ttft_p90, c.ttft_count, 100 * c.itl_median,
                  100 * c.itl_p90, c.itl_count);
    out << line;
  }
  return out.str();
}

std::string to_json(const std::vector<RunReport>& reports) {
  if (reports.size() == 1) return boost::json::serialize(report_json(reports[0])) + "\n";
  boost::json::array a;
  for (const auto& r : reports) a.push_back(report_json(r));
  boost::json::object o;
  o["sweep"] = std::move(a);
  return boost::json::serialize(o) + "\n";
}

std::string svg_line_chart(const std::string& title, const std::string& x_label, const std::string& y_label,
                           const std::vector<Series>& series, bool log_x) {
  // Colour-blind-safe palette (Okabe & Ito, 2008) extended with greys for more than eight series.
  static const char* kColors[] = {"#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00",
                                  "#F0E442", "#000000", "#999999", "#666666", "#8C564B", "#17BECF"};
  const double W = 900, H = 560, L = 80, R = 230, T = 50, B = 60;
  double x0 = INFINITY, x1 = -INFINITY, y0 = 0, y1 = -INFINITY;
  auto tx = [&](double x) { return log_x ? std::log10(std::max(x, 1e-9)) : x; };
  for (const auto& s : series)
    for (auto [x, y] : s.points) {
      x0 = std::min(x0, tx(x));
      x1 = std::max(x1, tx(x));
      y1 = std::max(y1, y);
    }
  if (!(x1 > x0)) { x0 = std::isfinite(x0) ? x0 - 1 : 0; x1 = x0 + 2; }
  if (!(y1 > y0)) y1 = y0 + 1;
  y1 *= 1.05;
  auto px = [&](double x) { return L + (tx(x) - x0) / (x1 - x0) * (W - L - R); };
  auto py = [&](double y) { return H - B - (y - y0) / (y1 - y0) * (H - T - B); };
  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s << "<text x=\"" << W / 2 << "\" y=\"24\" text-anchor=\"middle\" font-size=\"16\">" << title << "</text>\n";
  // Axes, ticks and grid.
  s << "<line x1=\"" << L << "\" y1=\"" << H - B << "\" x2=\"" << W - R << "\" y2=\"" << H - B << "\" stroke=\"black\"/>\n";
  s << "<line x1=\"" << L << "\" y1=\"" << T << "\" x2=\"" << L << "\" y2=\"" << H - B << "\" stroke=\"black\"/>\n";
  for (int k = 0; k <= 5; ++k) {
    const double yv = y0 + (y1 - y0) * k / 5;
    s << "<line x1=\"" << L << "\" y1=\"" << py(yv) << "\" x2=\"" << W - R << "\" y2=\"" << py(yv)
      << "\" stroke=\"#eee\"/>\n<text x=\"" << L - 6 << "\" y=\"" << py(yv) + 4 << "\" text-anchor=\"end\">"
      << fmt("%.3g", yv) << "</text>\n";
  }
  if (log_x) {
    for (int e = static_cast<int>(std::floor(x0)); e <= static_cast<int>(std::ceil(x1)); ++e) {
      if (e < x0 - 1e-9 || e > x1 + 1e-9) continue;
      const double xv = std::pow(10.0, e);
      s << "<line x1=\"" << px(xv) << "\" y1=\"" << T << "\" x2=\"" << px(xv) << "\" y2=\"" << H - B
        << "\" stroke=\"#eee\"/>\n<text x=\"" << px(xv) << "\" y=\"" << H - B + 16 << "\" text-anchor=\"middle\">"
        << fmt("%g", xv) << "</text>\n";
    }
  } else {
    for (int k = 0; k <= 5; ++k) {
      const double xv = x0 + (x1 - x0) * k / 5;
      s << "<text x=\"" << px(xv) << "\" y=\"" << H - B + 16 << "\" text-anchor=\"middle\">" << fmt("%.3g", xv)
        << "</text>\n";
    }
  }
  s << "<text x=\"" << (L + W - R) / 2 << "\" y=\"" << H - 16 << "\" text-anchor=\"middle\">" << x_label << "</text>\n";
  s << "<text transform=\"translate(18," << (T + H - B) / 2 << ") rotate(-90)\" text-anchor=\"middle\">" << y_label
    << "</text>\n";
  for (std::size_t i = 0; i < series.size(); ++i) {
    const char* c = kColors[i % (sizeof kColors / sizeof *kColors)];
    s << "<polyline fill=\"none\" stroke=\"" << c << "\" stroke-width=\"1.8\" points=\"";
    for (auto [x, y] : series[i].points) s << fmt("%.1f", px(x)) << "," << fmt("%.1f", py(y)) << " ";
    s << "\"/>\n";
    const double ly = T + 10 + 18.0 * static_cast<double>(i);
    s << "<line x1=\"" << W - R + 12 << "\" y1=\"" << ly << "\" x2=\"" << W - R + 34 << "\" y2=\"" << ly
      << "\" stroke=\"" << c << "\" stroke-width=\"3\"/>\n<text x=\"" << W - R + 40 << "\" y=\"" << ly + 4 << "\">"
      << series[i].name << "</text>\n";
  }
  s << "</svg>\n";
  return s.str();
}

Result<std::vector<std::string>> write_plots(const std::string& dir, const std::vector<RunReport>& reports) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return make_error("cannot create plot directory '" + dir + "': " + ec.message());
  std::vector<std::string> written;
  auto write = [&](const std::string& name, const std::string& body) -> bool {
    const std::string path = (std::filesystem::path(dir) / name).string();
    std::ofstream f(path);
    f << body;
    if (!f) return false;
    written.push_back(path);
    return true;
  };
  for (const RunReport& r : reports) {
    std::vector<Series> cdf;
    for (const PolicyResult& p : r.policies) {
      Series s{p.name, {}};
      // At most ~400 points per curve keeps the file small; the tail is kept exactly.
      const std::size_t n = p.ttfts.size();
      const std::size_t step = std::max<std::size_t>(1, n / 400);
      for (std::size_t i = 0; i < n; i += step) s.points.emplace_back(std::max(p.ttfts[i], 1e-4), (i + 1.0) / n);
      if (n) s.points.emplace_back(std::max(p.ttfts.back(), 1e-4), 1.0);
      cdf.push_back(std::move(s));
    }
    const std::string name = reports.size() == 1 ? "ttft_cdf.svg" : "ttft_cdf_" + fmt("%g", r.rate_scale) + ".svg";
    if (!write(name, svg_line_chart("TTFT CDF: " + r.workload + ", " + std::to_string(r.workers) +
                                        " workers, rate scale " + fmt("%g", r.rate_scale),
                                    "TTFT (s, log scale)", "fraction of requests", cdf, true)))
      return make_error("cannot write " + name + " in '" + dir + "'");
  }
  if (reports.size() > 1) {
    std::vector<Series> hit, p99;
    for (std::size_t k = 0; k < reports[0].policies.size(); ++k) {
      Series h{reports[0].policies[k].name, {}}, q{reports[0].policies[k].name, {}};
      for (const RunReport& r : reports) {
        if (k >= r.policies.size()) continue;
        h.points.emplace_back(r.rate_scale, 100 * r.policies[k].hit_rate);
        q.points.emplace_back(r.rate_scale, r.policies[k].ttft.p99);
      }
      hit.push_back(std::move(h));
      p99.push_back(std::move(q));
    }
    Series cap{"capacity bound", {}}, ub{"infinite cache", {}};
    for (const RunReport& r : reports) {
      cap.points.emplace_back(r.rate_scale, 100 * r.capacity_bound_hit_rate);
      ub.points.emplace_back(r.rate_scale, 100 * r.upper_bound_hit_rate);
    }
    hit.push_back(std::move(cap));
    hit.push_back(std::move(ub));
    if (!write("hit_rate_vs_load.svg", svg_line_chart("Prefix hit rate vs load: " + reports[0].workload,
                                                      "rate scale", "hit rate (%)", hit, false)) ||
        !write("ttft_p99_vs_load.svg", svg_line_chart("p99 TTFT vs load: " + reports[0].workload, "rate scale",
                                                      "p99 TTFT (s)", p99, false)))
      return make_error("cannot write sweep plots in '" + dir + "'");
  }
  return written;
}

}  // namespace kvroute::bench
