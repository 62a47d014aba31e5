#include "backends/events/metrics_parse.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>

namespace kvroute::events {

const std::string* MetricSample::label(std::string_view key) const {
  for (const auto& [k, v] : labels) {
    if (k == key) return &v;
  }
  return nullptr;
}

namespace {

bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':'; }
bool is_name_char(char c) { return is_name_start(c) || (c >= '0' && c <= '9'); }

void skip_blanks(std::string_view s, std::size_t& i) {
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
}

// Prometheus values: Go float syntax plus NaN, +Inf, -Inf (case-insensitive in practice).
bool parse_value(std::string_view tok, double& out) {
  if (tok.empty()) return false;
  std::string_view t = tok;
  bool neg = false;
  if (t[0] == '+' || t[0] == '-') {
    neg = t[0] == '-';
    t.remove_prefix(1);
  }
  auto ieq = [](std::string_view a, std::string_view b) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i) {
      if ((a[i] | 0x20) != (b[i] | 0x20)) return false;
    }
    return true;
  };
  if (ieq(t, "inf") || ieq(t, "infinity")) {
    out = neg ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
    return true;
  }
  if (ieq(t, "nan")) {
    out = std::numeric_limits<double>::quiet_NaN();
    return true;
  }
  // from_chars rejects a leading '+', which is why the sign was taken off above.
  double v = 0;
  auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  if (ec != std::errc() || p != t.data() + t.size()) return false;
  out = neg ? -v : v;
  return true;
}

bool parse_line(std::string_view line, MetricSample& s) {
  std::size_t i = 0;
  skip_blanks(line, i);
  const std::size_t name_begin = i;
  if (i >= line.size() || !is_name_start(line[i])) return false;
  while (i < line.size() && is_name_char(line[i])) ++i;
  s.name.assign(line.substr(name_begin, i - name_begin));
  s.labels.clear();
  s.timestamp_ms.reset();
  skip_blanks(line, i);
  if (i < line.size() && line[i] == '{') {
    ++i;
    while (true) {
      skip_blanks(line, i);
      if (i < line.size() && line[i] == '}') {
        ++i;
        break;
      }
      const std::size_t kb = i;
      if (i >= line.size() || !is_name_start(line[i])) return false;
      while (i < line.size() && is_name_char(line[i])) ++i;
      std::string key(line.substr(kb, i - kb));
      skip_blanks(line, i);
      if (i >= line.size() || line[i] != '=') return false;
      ++i;
      skip_blanks(line, i);
      if (i >= line.size() || line[i] != '"') return false;
      ++i;
      std::string value;
      bool closed = false;
      while (i < line.size()) {
        const char c = line[i++];
        if (c == '"') {
          closed = true;
          break;
        }
        if (c == '\\') {
          if (i >= line.size()) return false;
          const char e = line[i++];
          value.push_back(e == 'n' ? '\n' : e);  // \\ and \" stand for themselves
        } else {
          value.push_back(c);
        }
      }
      if (!closed) return false;
      s.labels.emplace_back(std::move(key), std::move(value));
      skip_blanks(line, i);
      if (i < line.size() && line[i] == ',') {
        ++i;
        continue;
      }
      if (i < line.size() && line[i] == '}') {
        ++i;
        break;
      }
      return false;
    }
  }
  skip_blanks(line, i);
  std::size_t vb = i;
  while (i < line.size() && line[i] != ' ' && line[i] != '\t') ++i;
  if (!parse_value(line.substr(vb, i - vb), s.value)) return false;
  skip_blanks(line, i);
  if (i < line.size()) {
    vb = i;
    while (i < line.size() && line[i] != ' ' && line[i] != '\t') ++i;
    std::string_view ts = line.substr(vb, i - vb);
    std::int64_t t = 0;
    auto [p, ec] = std::from_chars(ts.data(), ts.data() + ts.size(), t);
    if (ec == std::errc() && p == ts.data() + ts.size()) {
      s.timestamp_ms = t;
    } else {
      // OpenMetrics timestamps are seconds with a fraction.
      double d = 0;
      // Beyond +-9.2e15 s the milliseconds do not fit an int64 (converting them would be undefined): malformed.
      if (!parse_value(ts, d) || !std::isfinite(d) || std::fabs(d) >= 9.2e15) return false;
      s.timestamp_ms = static_cast<std::int64_t>(d * 1000.0);
    }
    skip_blanks(line, i);
    if (i < line.size()) return false;
  }
  return true;
}

bool wanted(std::string_view line, const std::vector<std::string>& prefixes) {
  if (prefixes.empty()) return true;
  std::size_t i = 0;
  skip_blanks(line, i);
  line.remove_prefix(i);
  for (const std::string& p : prefixes) {
    if (line.substr(0, p.size()) == p) return true;
  }
  return false;
}

}  // namespace

ParsedMetrics parse_prometheus_text(std::string_view text, const ParseOptions& options) {
  ParsedMetrics out;
  if (text.size() > options.max_bytes) {
    text = text.substr(0, options.max_bytes);
    ++out.malformed_lines;
  }
  MetricSample s;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    std::string_view line = text.substr(pos, nl - pos);
    pos = nl + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    std::size_t i = 0;
    skip_blanks(line, i);
    if (i == line.size() || line[i] == '#') continue;
    if (!wanted(line, options.name_prefixes)) continue;
    if (out.samples.size() >= options.max_samples) {
      ++out.malformed_lines;
      break;
    }
    if (parse_line(line, s)) {
      out.samples.push_back(s);
    } else {
      ++out.malformed_lines;
    }
  }
  return out;
}

namespace {

// Sum / mean of the non-NaN samples of one name.
struct Agg {
  double sum = 0;
  int n = 0;
  void add(double v) {
    if (std::isnan(v)) return;
    sum += v;
    ++n;
  }
  std::optional<double> total() const { return n ? std::optional<double>(sum) : std::nullopt; }
  std::optional<double> mean() const { return n ? std::optional<double>(sum / n) : std::nullopt; }
};

std::optional<std::uint64_t> label_uint(const MetricSample& s, std::string_view key) {
  const std::string* v = s.label(key);
  if (v == nullptr) return std::nullopt;
  std::uint64_t x = 0;
  auto [p, ec] = std::from_chars(v->data(), v->data() + v->size(), x);
  if (ec != std::errc() || p != v->data() + v->size()) return std::nullopt;
  return x;
}

}  // namespace

WorkerTelemetry extract_telemetry(const ParsedMetrics& metrics) {
  Agg running, waiting, usage, old_usage, queries, hits, old_queries, old_hits;
  Agg sg_running, sg_waiting, sg_usage, sg_hit;
  std::optional<std::uint64_t> gpu_blocks, cpu_blocks;
  std::optional<std::uint32_t> block_size;
  bool vllm = false, sglang = false;
  for (const MetricSample& s : metrics.samples) {
    const std::string& n = s.name;
    if (n.rfind("vllm:", 0) == 0) {
      vllm = true;
      if (n == "vllm:num_requests_running") running.add(s.value);
      else if (n == "vllm:num_requests_waiting") waiting.add(s.value);
      else if (n == "vllm:kv_cache_usage_perc") usage.add(s.value);
      else if (n == "vllm:gpu_cache_usage_perc") old_usage.add(s.value);
      else if (n == "vllm:prefix_cache_queries_total") queries.add(s.value);
      else if (n == "vllm:prefix_cache_hits_total") hits.add(s.value);
      else if (n == "vllm:gpu_prefix_cache_queries_total") old_queries.add(s.value);
      else if (n == "vllm:gpu_prefix_cache_hits_total") old_hits.add(s.value);
      else if (n == "vllm:cache_config_info") {
        // One info series per engine; with data parallelism each rank has its own blocks.
        if (auto b = label_uint(s, "num_gpu_blocks")) gpu_blocks = gpu_blocks.value_or(0) + *b;
        if (auto b = label_uint(s, "num_cpu_blocks"); b && *b > 0) cpu_blocks = cpu_blocks.value_or(0) + *b;
        if (auto b = label_uint(s, "block_size"); b && *b > 0 && *b <= 1u << 20) {
          block_size = static_cast<std::uint32_t>(*b);
        }
      }
    } else if (n.rfind("sglang:", 0) == 0) {
      sglang = true;
      if (n == "sglang:num_running_reqs") sg_running.add(s.value);
      else if (n == "sglang:num_queue_reqs") sg_waiting.add(s.value);
      else if (n == "sglang:token_usage") sg_usage.add(s.value);
      else if (n == "sglang:cache_hit_rate") sg_hit.add(s.value);
    }
  }
  WorkerTelemetry t;
  if (vllm) {
    t.engine = EngineKind::kVllm;
    t.running = running.total();
    t.waiting = waiting.total();
    t.kv_usage = usage.n ? usage.mean() : old_usage.mean();
    t.prefix_cache_queries = queries.n ? queries.total() : old_queries.total();
    t.prefix_cache_hits = hits.n ? hits.total() : old_hits.total();
    if (t.prefix_cache_queries && t.prefix_cache_hits && *t.prefix_cache_queries > 0) {
      t.cache_hit_rate = *t.prefix_cache_hits / *t.prefix_cache_queries;
    }
    t.num_gpu_blocks = gpu_blocks;
    t.num_cpu_blocks = cpu_blocks;
    t.block_size = block_size;
  } else if (sglang) {
    t.engine = EngineKind::kSglang;
    t.running = sg_running.total();
    t.waiting = sg_waiting.total();
    t.kv_usage = sg_usage.mean();
    t.cache_hit_rate = sg_hit.mean();
  }
  // Fractions outside 0..1 (or infinities) are not usable as occupancy.
  if (t.kv_usage && !(*t.kv_usage >= 0 && *t.kv_usage <= 1.0 + 1e-9)) t.kv_usage.reset();
  if (t.cache_hit_rate && !(*t.cache_hit_rate >= 0 && *t.cache_hit_rate <= 1.0 + 1e-9)) t.cache_hit_rate.reset();
  for (auto* v : {&t.running, &t.waiting}) {
    if (*v && !(std::isfinite(**v) && **v >= 0)) v->reset();
  }
  return t;
}

WorkerTelemetry parse_worker_telemetry(std::string_view text) {
  static const ParseOptions kOptions{.name_prefixes = {"vllm:num_requests_", "vllm:kv_cache_usage_perc",
                                                       "vllm:gpu_cache_usage_perc", "vllm:prefix_cache_",
                                                       "vllm:gpu_prefix_cache_", "vllm:cache_config_info",
                                                       "sglang:num_running_reqs", "sglang:num_queue_reqs",
                                                       "sglang:token_usage", "sglang:cache_hit_rate"}};
  return extract_telemetry(parse_prometheus_text(text, kOptions));
}

}  // namespace kvroute::events
