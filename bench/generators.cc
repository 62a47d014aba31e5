#include "bench/generators.h"

#include <algorithm>
#include <cmath>

namespace kvroute::bench {

std::uint64_t SplitMix::next() {
  std::uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double SplitMix::uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

std::uint64_t SplitMix::range(std::uint64_t lo, std::uint64_t hi) {
  if (hi <= lo) return lo;
  return lo + next() % (hi - lo + 1);
}

double SplitMix::exponential(double mean) { return -mean * std::log1p(-uniform()); }

Zipf::Zipf(std::size_t n, double s) {
  cdf_.resize(std::max<std::size_t>(n, 1));
  double sum = 0;
  for (std::size_t k = 0; k < cdf_.size(); ++k) cdf_[k] = (sum += 1.0 / std::pow(static_cast<double>(k + 1), s));
  for (double& c : cdf_) c /= sum;
}

std::size_t Zipf::sample(SplitMix& rng) const {
  const double u = rng.uniform();
  return std::min<std::size_t>(std::upper_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin(), cdf_.size() - 1);
}

namespace internal {

constexpr std::uint32_t kVocab = 151'000;  // Qwen3's vocabulary size, order of magnitude

void append_segment(std::vector<std::uint32_t>& tokens, std::uint64_t segment, std::uint32_t length) {
  SplitMix rng(segment * 0x2545F4914F6CDD1Dull + 0x1234567ull);
  for (std::uint32_t k = 0; k < length; ++k) tokens.push_back(static_cast<std::uint32_t>(rng.next() % kVocab));
}

std::uint64_t segment_id(std::uint64_t kind, std::uint64_t a, std::uint64_t b, std::uint64_t c) {
  SplitMix m(kind * 0x100000001B3ull ^ (a << 20) ^ (b << 40) ^ c);
  return m.next() ^ m.next();
}

}  // namespace internal

namespace {

using internal::append_segment;
std::uint64_t seg(std::uint64_t kind, std::uint64_t a, std::uint64_t b = 0, std::uint64_t c = 0) {
  return internal::segment_id(kind, a, b, c);
}

// Turns a token sequence (prompt followed by the output the engine will generate) into a Request.
Request make_request(double t, std::uint64_t root, const std::vector<std::uint32_t>& tokens, std::uint32_t prompt,
                     std::uint32_t output, std::string affinity_key, std::uint64_t session = 0) {
  Request r;
  r.arrival_s = t;
  r.prompt_tokens = prompt;
  r.output_tokens = std::max<std::uint32_t>(output, 1);
  hashing::BlockChain full = hashing::hash_tokens(root, tokens, kBlockTokens);
  const std::size_t prompt_blocks = prompt / kBlockTokens;
  r.chain = full;
  r.chain.total_units = prompt;
  r.chain.hashes.resize(prompt_blocks);
  r.output_blocks.assign(full.hashes.begin() + static_cast<std::ptrdiff_t>(prompt_blocks), full.hashes.end());
  r.affinity_key = std::move(affinity_key);
  r.session = session;
  return r;
}

std::vector<std::uint32_t> with_output(std::vector<std::uint32_t> prompt, std::uint64_t out_segment,
                                       std::uint32_t output) {
  append_segment(prompt, out_segment, output);
  return prompt;
}

// Request rates (req/s at --rate-scale 1) are chosen so that 8 Qwen3-8B/H100 workers are busy but not
// saturated under round robin; --rate-scale moves along the load axis.

Workload shared_prefix(const GeneratorOptions& o) {
  const std::size_t n = o.requests ? o.requests : 6000;
  constexpr std::size_t kGroups = 48;
  constexpr double kRate = 140.0;
  SplitMix rng(o.seed ^ 0x5348415245ull);
  std::vector<std::uint32_t> prefix_len(kGroups);
  for (auto& l : prefix_len) l = static_cast<std::uint32_t>(rng.range(2048, 10240));
  const std::uint64_t root = hashing::namespace_root(o.model, "");
  Workload w;
  w.name = "shared_prefix";
  double t = 0;
  for (std::size_t i = 0; i < n; ++i) {
    t += rng.exponential(1.0 / kRate);
    const std::size_t g = rng.range(0, kGroups - 1);
    const auto q = static_cast<std::uint32_t>(rng.range(32, 512));
    const auto out = static_cast<std::uint32_t>(rng.range(32, 384));
    std::vector<std::uint32_t> tokens;
    append_segment(tokens, seg(1, g), prefix_len[g]);
    append_segment(tokens, seg(2, o.seed, i), q);
    const auto prompt = static_cast<std::uint32_t>(tokens.size());
    w.requests.push_back(make_request(t, root, with_output(std::move(tokens), seg(3, o.seed, i), out), prompt, out,
                                      o.model + "/group" + std::to_string(g)));
  }
  finalize(w);
  return w;
}

Workload multi_turn(const GeneratorOptions& o) {
  const std::size_t n = o.requests ? o.requests : 6000;
  constexpr std::size_t kSystemPrompts = 4;
  constexpr double kSessionRate = 40.0;  // new chats per second
  constexpr double kThinkMean = 3.0;     // seconds between an answer and the next user message
  SplitMix rng(o.seed ^ 0x434841540ull);
  std::vector<std::uint32_t> system_len(kSystemPrompts);
  for (auto& l : system_len) l = static_cast<std::uint32_t>(rng.range(1024, 3072));
  const std::uint64_t root = hashing::namespace_root(o.model, "");
  Workload w;
  w.name = "multi_turn";
  double session_start = 0;
  for (std::uint64_t s = 1; w.requests.size() < n; ++s) {
    session_start += rng.exponential(1.0 / kSessionRate);
    const std::size_t sys = rng.range(0, kSystemPrompts - 1);
    const std::size_t turns = rng.range(2, 12);
    std::vector<std::uint32_t> context;
    append_segment(context, seg(10, sys), system_len[sys]);
    const std::uint64_t first_user = seg(11, o.seed, s, 0);
    std::string key;
    double t = session_start;
    for (std::size_t turn = 0; turn < turns && w.requests.size() < n; ++turn) {
      const auto user = static_cast<std::uint32_t>(rng.range(64, turn == 0 ? 1536 : 512));
      append_segment(context, turn == 0 ? first_user : seg(11, o.seed, s, turn), user);
      if (turn == 0) key = o.model + "/" + std::to_string(first_user % 1000003);
      const auto out = static_cast<std::uint32_t>(rng.range(64, 640));
      const auto prompt = static_cast<std::uint32_t>(context.size());
      w.requests.push_back(
          make_request(t, root, with_output(context, seg(12, o.seed, s, turn), out), prompt, out, key, s));
      append_segment(context, seg(12, o.seed, s, turn), out);
      // The next message comes after the answer (roughly out x 20 ms of decoding) and the user's think time.
      t += out * 0.02 + rng.exponential(kThinkMean);
    }
  }
  finalize(w, n);
  return w;
}

Workload tenants(const GeneratorOptions& o) {
  const std::size_t n = o.requests ? o.requests : 6000;
  constexpr std::size_t kTenants = 40, kUsers = 6;
  constexpr double kRate = 120.0;
  SplitMix rng(o.seed ^ 0x54454e414e54ull);
  std::vector<std::uint32_t> system_len(kTenants);
  for (auto& l : system_len) l = static_cast<std::uint32_t>(rng.range(3072, 8192));
  std::vector<std::uint32_t> user_len(kTenants * kUsers);
  for (auto& l : user_len) l = static_cast<std::uint32_t>(rng.range(256, 2048));
  const Zipf popularity(kTenants, 0.8);
  Workload w;
  w.name = "tenants";
  double t = 0;
  for (std::size_t i = 0; i < n; ++i) {
    t += rng.exponential(1.0 / kRate);
    const std::size_t tenant = popularity.sample(rng);
    const std::size_t user = rng.range(0, kUsers - 1);
    // Each tenant has its own cache namespace (cache_salt): tenants never share blocks.
    const std::uint64_t root = hashing::namespace_root(o.model, "tenant-" + std::to_string(tenant));
    std::vector<std::uint32_t> tokens;
    append_segment(tokens, seg(20, tenant), system_len[tenant]);
    append_segment(tokens, seg(21, tenant, user), user_len[tenant * kUsers + user]);
    append_segment(tokens, seg(22, o.seed, i), static_cast<std::uint32_t>(rng.range(32, 384)));
    const auto out = static_cast<std::uint32_t>(rng.range(32, 320));
    const auto prompt = static_cast<std::uint32_t>(tokens.size());
    w.requests.push_back(make_request(t, root, with_output(std::move(tokens), seg(23, o.seed, i), out), prompt, out,
                                      o.model + "/tenant" + std::to_string(tenant) + "/user" + std::to_string(user)));
  }
  finalize(w);
  return w;
}

Workload zipf_tools(const GeneratorOptions& o) {
  const std::size_t n = o.requests ? o.requests : 6000;
  constexpr std::size_t kTools = 160;
  constexpr double kRate = 160.0;
  SplitMix rng(o.seed ^ 0x544f4f4cull);
  std::vector<std::uint32_t> tool_len(kTools);
  for (auto& l : tool_len) l = static_cast<std::uint32_t>(rng.range(1024, 8192));
  const Zipf popularity(kTools, 1.1);
  const std::uint64_t root = hashing::namespace_root(o.model, "");
  Workload w;
  w.name = "zipf_tools";
  double t = 0;
  for (std::size_t i = 0; i < n; ++i) {
    t += rng.exponential(1.0 / kRate);
    const std::size_t tool = popularity.sample(rng);
    std::vector<std::uint32_t> tokens;
    append_segment(tokens, seg(30, tool), tool_len[tool]);
    append_segment(tokens, seg(31, o.seed, i), static_cast<std::uint32_t>(rng.range(16, 320)));
    const auto out = static_cast<std::uint32_t>(rng.range(16, 256));
    const auto prompt = static_cast<std::uint32_t>(tokens.size());
    w.requests.push_back(make_request(t, root, with_output(std::move(tokens), seg(32, o.seed, i), out), prompt, out,
                                      o.model + "/tool" + std::to_string(tool)));
  }
  finalize(w);
  return w;
}

}  // namespace

const std::vector<std::string>& generator_names() {
  static const std::vector<std::string> names = {"shared_prefix", "multi_turn", "tenants", "zipf_tools"};
  return names;
}

Result<Workload> generate_workload(std::string_view name, const GeneratorOptions& options) {
  if (name == "shared_prefix") return shared_prefix(options);
  if (name == "multi_turn") return multi_turn(options);
  if (name == "tenants") return tenants(options);
  if (name == "zipf_tools") return zipf_tools(options);
  std::string valid;
  for (const auto& n : generator_names()) valid += (valid.empty() ? "" : ", ") + n;
  return make_error("unknown workload '" + std::string(name) + "' (valid: " + valid + ")");
}

}  // namespace kvroute::bench
