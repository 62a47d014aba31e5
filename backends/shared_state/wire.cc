#include "backends/shared_state/wire.h"

#include <charconv>
#include <cstdio>
#include <cstdlib>

#include <algorithm>
#include <bit>
#include <cstring>
#include <map>

namespace kvroute::shared_state {
namespace {

template <class T>
bool parse_number(std::string_view s, T& out) {
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && end == s.data() + s.size();
}

bool parse_double(std::string_view s, double& out) {
  if (s.empty() || s.size() > 64) return false;
  const std::string copy(s);
  char* end = nullptr;
  out = std::strtod(copy.c_str(), &end);
  return end == copy.c_str() + copy.size();
}

// The fields of a tab-separated line.
std::vector<std::string_view> fields(std::string_view line) {
  std::vector<std::string_view> out;
  while (true) {
    const auto tab = line.find('\t');
    out.push_back(line.substr(0, tab));
    if (tab == std::string_view::npos) return out;
    line.remove_prefix(tab + 1);
  }
}

// Each line of `text` (without its newline), skipping empty ones.
template <class F>
void for_each_line(std::string_view text, F&& f) {
  while (!text.empty()) {
    const auto nl = text.find('\n');
    const auto line = text.substr(0, nl);
    if (!line.empty()) f(line);
    if (nl == std::string_view::npos) break;
    text.remove_prefix(nl + 1);
  }
}

}  // namespace

std::string RedisUrl::display() const { return "redis://" + host + ":" + std::to_string(port) + "/" + std::to_string(db); }

Result<RedisUrl> parse_redis_url(std::string_view url) {
  const std::string shown(url.substr(0, url.find('@') == std::string_view::npos ? url.size() : 0));
  auto bad = [&](const std::string& why) {
    // The URL may carry a password: it is named only when it has none.
    return make_error("--shared-state " + (shown.empty() ? std::string("URL") : "'" + shown + "'") + ": " + why +
                      " (expected redis://[:PASSWORD@]HOST:PORT[/DB])");
  };
  if (!url.starts_with("redis://")) return bad("only redis:// is supported");
  std::string_view rest = url.substr(8);
  RedisUrl out;
  if (const auto at = rest.rfind('@'); at != std::string_view::npos) {
    const std::string_view auth = rest.substr(0, at);
    const auto colon = auth.find(':');
    if (colon == std::string_view::npos) return bad("credentials must be :PASSWORD or USER:PASSWORD");
    out.user = std::string(auth.substr(0, colon));
    out.password = std::string(auth.substr(colon + 1));
    rest = rest.substr(at + 1);
  }
  if (const auto slash = rest.find('/'); slash != std::string_view::npos) {
    const std::string_view db = rest.substr(slash + 1);
    if (!db.empty() && (!parse_number(db, out.db) || out.db < 0 || out.db > 65535)) return bad("DB must be a number");
    rest = rest.substr(0, slash);
  }
  std::string_view port;
  if (rest.starts_with("[")) {
    const auto close = rest.find(']');
    if (close == std::string_view::npos) return bad("unterminated '['");
    out.host = std::string(rest.substr(1, close - 1));
    if (close + 1 < rest.size() && rest[close + 1] == ':') port = rest.substr(close + 2);
  } else {
    const auto colon = rest.rfind(':');
    out.host = std::string(rest.substr(0, colon));
    if (colon != std::string_view::npos) port = rest.substr(colon + 1);
  }
  if (out.host.empty()) return bad("missing host");
  if (!port.empty() && (!parse_number(port, out.port) || out.port < 1 || out.port > 65535)) {
    return bad("port must be a number from 1 to 65535");
  }
  return out;
}

std::string encode_attrs(const std::vector<std::pair<std::string, std::string>>& attrs) {
  std::string out;
  for (const auto& [k, v] : attrs) {
    if (v.empty() || v.find_first_of("\t\n") != std::string::npos) continue;
    out += k + '\t' + v + '\n';
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> decode_attrs(std::string_view text) {
  std::vector<std::pair<std::string, std::string>> out;
  for_each_line(text, [&](std::string_view line) {
    const auto f = fields(line);
    if (f.size() == 2) out.emplace_back(std::string(f[0]), std::string(f[1]));
  });
  return out;
}

namespace wire {

std::string pack_hashes(std::span<const hashing::BlockHash> hashes) {
  std::string out(hashes.size() * 8, '\0');
  if constexpr (std::endian::native == std::endian::little) {  // the wire's byte order: one copy
    if (!hashes.empty()) std::memcpy(out.data(), hashes.data(), out.size());
    return out;
  }
  for (std::size_t i = 0; i < hashes.size(); ++i) {
    for (int b = 0; b < 8; ++b) out[i * 8 + b] = static_cast<char>((hashes[i] >> (8 * b)) & 0xff);
  }
  return out;
}

std::vector<hashing::BlockHash> unpack_hashes(std::string_view bytes) {
  std::vector<hashing::BlockHash> out(bytes.size() / 8);
  if constexpr (std::endian::native == std::endian::little) {
    if (!out.empty()) std::memcpy(out.data(), bytes.data(), out.size() * 8);
    return out;
  }
  for (std::size_t i = 0; i < out.size(); ++i) {
    std::uint64_t h = 0;
    for (int b = 0; b < 8; ++b) h |= std::uint64_t{static_cast<unsigned char>(bytes[i * 8 + b])} << (8 * b);
    out[i] = h;
  }
  return out;
}

std::string hex64(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::optional<std::uint64_t> parse_hex64(std::string_view s) {
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v, 16);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

std::string pack_load(const std::vector<WorkerLoad>& load) {
  std::string out;
  char buf[160];
  for (const auto& l : load) {
    std::snprintf(buf, sizeof buf, "\t%u\t%llu\t%.6g\t%.6g\t%llu\t%.6g\t%llu\n", l.in_flight,
                  static_cast<unsigned long long>(l.pending_prefill_tokens), l.pending_prefill_s, l.oldest_prefill_s,
                  static_cast<unsigned long long>(l.active_decode_tokens), l.prefill_elapsed_s,
                  static_cast<unsigned long long>(l.inflight_kv_tokens));
    out += l.worker;
    out += buf;
  }
  return out;
}

void add_load(const WorkerLoad& l, std::vector<WorkerLoad>& sum) {
  auto it = std::find_if(sum.begin(), sum.end(), [&](const WorkerLoad& s) { return s.worker == l.worker; });
  if (it == sum.end()) return sum.push_back(l);
  it->in_flight += l.in_flight;
  it->pending_prefill_tokens += l.pending_prefill_tokens;
  it->pending_prefill_s += l.pending_prefill_s;
  it->oldest_prefill_s = std::max(it->oldest_prefill_s, l.oldest_prefill_s);
  it->active_decode_tokens += l.active_decode_tokens;
  it->prefill_elapsed_s = std::max(it->prefill_elapsed_s, l.prefill_elapsed_s);
  it->inflight_kv_tokens += l.inflight_kv_tokens;
}

void add_load(std::string_view text, std::vector<WorkerLoad>& sum) {
  for_each_line(text, [&](std::string_view line) {
    const auto f = fields(line);
    WorkerLoad l;
    // Six or seven fields from a replica of an earlier version (no time without a first token, no KV tokens in
    // flight), eight now.
    if (f.size() < 6 || f.size() > 8 || !parse_number(f[1], l.in_flight) ||
        !parse_number(f[2], l.pending_prefill_tokens) || !parse_double(f[3], l.pending_prefill_s) ||
        !parse_double(f[4], l.oldest_prefill_s) || !parse_number(f[5], l.active_decode_tokens) ||
        (f.size() >= 7 && (!parse_double(f[6], l.prefill_elapsed_s) || !(l.prefill_elapsed_s < 1e6))) ||
        (f.size() == 8 && !parse_number(f[7], l.inflight_kv_tokens))) {
      return;
    }
    l.worker = std::string(f[0]);
    add_load(l, sum);
  });
}

std::vector<WorkerLoad> queued_at(const std::vector<WorkerLoad>& parts, double now) {
  std::map<std::string_view, std::vector<policy::TimedShare>> by_worker;
  for (const WorkerLoad& l : parts) by_worker[l.worker].push_back({l.at, l.share()});
  std::vector<WorkerLoad> out;
  for (auto& [worker, timed] : by_worker) {
    out.push_back(WorkerLoad::of(std::string(worker), policy::queued_at(std::move(timed), now), now));
  }
  return out;
}

std::string pack_load_seq(std::uint64_t seq) { return "#\t" + std::to_string(seq) + "\n"; }

std::uint64_t load_seq(std::string_view text) {
  if (!text.starts_with("#\t")) return 0;
  const auto f = fields(text.substr(0, text.find('\n')));
  std::uint64_t seq = 0;
  return f.size() == 2 && parse_number(f[1], seq) ? seq : 0;
}

std::string pack_share(const policy::LoadShare& l) {
  char buf[80];
  std::snprintf(buf, sizeof buf, "%llu\t%.6g\t%llu", static_cast<unsigned long long>(l.pending_prefill_tokens),
                l.pending_prefill_s, static_cast<unsigned long long>(l.inflight_kv_tokens));
  return buf;
}

std::optional<policy::LoadShare> unpack_share(std::string_view text) {
  const auto f = fields(text);
  policy::LoadShare l;
  l.in_flight = 1;
  // Two fields from a replica of an earlier version (no KV tokens), three now.
  if ((f.size() != 2 && f.size() != 3) || !parse_number(f[0], l.pending_prefill_tokens) ||
      !parse_double(f[1], l.pending_prefill_s) || !(l.pending_prefill_s >= 0 && l.pending_prefill_s < 1e6) ||
      (f.size() == 3 && !parse_number(f[2], l.inflight_kv_tokens))) {
    return std::nullopt;
  }
  return l;
}

std::optional<std::uint64_t> parse_count(std::string_view s) {
  std::uint64_t v = 0;
  if (s.empty() || !parse_number(s, v)) return std::nullopt;
  return v;
}

std::string pack_rates(const policy::WorkerRates& r) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%.9g\t%.9g\t%.9g\t%.9g\t%.9g\t%.9g\t%llu\t%llu", r.prefill_tokens_per_s,
                r.transfer_tokens_per_s, r.decode_step_s, r.decode_step_per_token_s, r.decode_correction,
                r.base_ttft_s, static_cast<unsigned long long>(r.prefill_samples),
                static_cast<unsigned long long>(r.decode_samples));
  return buf;
}

std::optional<policy::WorkerRates> unpack_rates(std::string_view text) {
  const auto f = fields(text);
  policy::WorkerRates r;
  if (f.size() != 8 || !parse_double(f[0], r.prefill_tokens_per_s) || !parse_double(f[1], r.transfer_tokens_per_s) ||
      !parse_double(f[2], r.decode_step_s) || !parse_double(f[3], r.decode_step_per_token_s) ||
      !parse_double(f[4], r.decode_correction) || !parse_double(f[5], r.base_ttft_s) ||
      !parse_number(f[6], r.prefill_samples) || !parse_number(f[7], r.decode_samples) || r.prefill_tokens_per_s <= 0) {
    return std::nullopt;
  }
  return r;
}

int compare_ids(std::string_view a, std::string_view b) {
  auto split_id = [](std::string_view id) {
    std::uint64_t ms = 0, seq = 0;
    const auto dash = id.find('-');
    parse_number(id.substr(0, dash), ms);
    if (dash != std::string_view::npos) parse_number(id.substr(dash + 1), seq);
    return std::pair{ms, seq};
  };
  const auto x = split_id(a), y = split_id(b);
  return x < y ? -1 : x > y ? 1 : 0;
}

}  // namespace wire
}  // namespace kvroute::shared_state
