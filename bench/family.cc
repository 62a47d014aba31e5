#include "bench/family.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "bench/generators.h"

namespace kvroute::bench {

std::string_view name_of(PrefixShape s) {
  switch (s) {
    case PrefixShape::kNone: return "none";
    case PrefixShape::kShared: return "shared";
    case PrefixShape::kTenants: return "tenants";
    case PrefixShape::kZipfTools: return "tools";
    case PrefixShape::kDocuments: return "documents";
  }
  return "none";
}

std::string_view name_of(SessionShape s) {
  switch (s) {
    case SessionShape::kNone: return "none";
    case SessionShape::kChat: return "chat";
    case SessionShape::kAgents: return "agents";
  }
  return "none";
}

std::string_view name_of(ArrivalShape s) { return s == ArrivalShape::kBursty ? "bursty" : "poisson"; }

std::string FamilyDraw::describe() const {
  char buf[320];
  std::string prefix_text(name_of(prefix));
  if (prefix != PrefixShape::kNone) {
    std::snprintf(buf, sizeof buf, "(%u x %u tok, zipf %.2f)", prefixes, prefix_tokens, zipf_s);
    prefix_text += buf;
  }
  std::string session_text(name_of(sessions));
  if (sessions == SessionShape::kAgents) session_text += "(to " + std::to_string(max_context) + " tok)";
  std::snprintf(buf, sizeof buf, "family seed=%llu load=%.2f prefix=%s sessions=%s arrivals=%s outputs=%s requests=%zu",
                static_cast<unsigned long long>(seed), load, prefix_text.c_str(), session_text.c_str(),
                std::string(name_of(arrivals)).c_str(), long_outputs ? "long" : "short", requests);
  return buf;
}

FamilyDraw draw_family(std::uint64_t seed) {
  SplitMix rng(seed * 0x9E3779B97F4A7C15ull ^ 0x46414d494c59ull);
  FamilyDraw d;
  d.seed = seed;
  d.load = 0.15 + 1.05 * rng.uniform();
  d.prefix = static_cast<PrefixShape>(rng.range(0, 4));
  // Log-uniform lengths: as many draws between 1K and 10K tokens as between 10K and 100K.
  const double lo = d.prefix == PrefixShape::kDocuments ? std::log(16384.0) : std::log(1024.0);
  const double tokens = std::exp(lo + (std::log(100000.0) - lo) * rng.uniform());
  if (d.prefix != PrefixShape::kNone) d.prefix_tokens = static_cast<std::uint32_t>(tokens / kBlockTokens) * kBlockTokens;
  switch (d.prefix) {
    case PrefixShape::kNone:
    case PrefixShape::kShared: d.prefixes = 1; break;
    case PrefixShape::kTenants: d.prefixes = static_cast<std::uint32_t>(rng.range(4, 48)); break;
    case PrefixShape::kZipfTools: d.prefixes = static_cast<std::uint32_t>(rng.range(16, 200)); break;
    case PrefixShape::kDocuments: d.prefixes = static_cast<std::uint32_t>(rng.range(4, 48)); break;
  }
  if (d.prefixes > 1) d.zipf_s = 0.6 + 0.8 * rng.uniform();
  d.sessions = static_cast<SessionShape>(rng.range(0, 2));
  // Agents grow their context to 32K-128K tokens, and at least 16K beyond a long shared prefix.
  if (d.sessions == SessionShape::kAgents)
    d.max_context = std::max(static_cast<std::uint32_t>(rng.range(32768, 131072)), d.prefix_tokens + 16384);
  d.arrivals = rng.uniform() < 0.5 ? ArrivalShape::kPoisson : ArrivalShape::kBursty;
  d.long_outputs = rng.uniform() < 0.5;
  return d;
}

namespace {

using internal::append_segment;
using internal::segment_id;

// A block chain built as tokens are appended: only the new full blocks are hashed (hashing/block_chain.h:
// h[i] = XXH3_64(block_i, seed = h[i-1]), so a chain continues from its last hash).
class ChainBuilder {
 public:
  explicit ChainBuilder(std::uint64_t root) : root_(root) {}
  void append(std::uint64_t segment, std::uint32_t length) {
    append_segment(tail_, segment, length);
    tokens_ += length;
    const std::size_t full = tail_.size() / kBlockTokens * kBlockTokens;
    if (full == 0) return;
    const std::uint64_t parent = hashes_.empty() ? root_ : hashes_.back();
    const hashing::BlockChain c =
        hashing::hash_tokens(parent, std::span<const std::uint32_t>(tail_.data(), full), kBlockTokens);
    hashes_.insert(hashes_.end(), c.hashes.begin(), c.hashes.end());
    tail_.erase(tail_.begin(), tail_.begin() + static_cast<std::ptrdiff_t>(full));
  }
  std::uint32_t tokens() const { return tokens_; }
  const std::vector<std::uint64_t>& hashes() const { return hashes_; }
  std::uint64_t root() const { return root_; }

 private:
  std::uint64_t root_;
  std::vector<std::uint64_t> hashes_;
  std::vector<std::uint32_t> tail_;  // tokens after the last full block
  std::uint32_t tokens_ = 0;
};

// The prompt built so far plus `out` output tokens of segment `out_seg`; the builder keeps the output appended
// (the next turn of a session continues after the answer).
Request turn_request(ChainBuilder& b, std::uint64_t out_seg, std::uint32_t out, double offset, std::uint64_t session,
                     std::string key) {
  Request r;
  r.arrival_s = offset;
  r.prompt_tokens = b.tokens();
  r.output_tokens = std::max<std::uint32_t>(out, 1);
  r.chain.root = b.root();
  r.chain.unit = hashing::Unit::kToken;
  r.chain.block_units = kBlockTokens;
  r.chain.total_units = r.prompt_tokens;
  r.chain.hashes = b.hashes();
  b.append(out_seg, r.output_tokens);
  r.output_blocks.assign(b.hashes().begin() + static_cast<std::ptrdiff_t>(r.chain.hashes.size()), b.hashes().end());
  r.session = session;
  r.affinity_key = std::move(key);
  return r;
}

// One unit of arrivals (a lone request, or a session's turns at offsets from its start) and the tokens each
// request adds to what an ideal cache would hold (for the capacity estimate).
struct Unit {
  std::vector<Request> requests;
  std::vector<std::uint32_t> new_tokens;
};

class Builder {
 public:
  Builder(const FamilyDraw& d, const std::string& model)
      : d_(d), model_(model), rng_(d.seed ^ 0x554e495453ull), popularity_(std::max<std::uint32_t>(d.prefixes, 1), d.zipf_s) {}

  Unit unit(std::uint64_t u) {
    const std::size_t p = d_.prefixes > 1 ? popularity_.sample(rng_) : 0;
    // Tenants keep their own cache namespace (cache_salt); everything else shares the model's.
    const std::string salt = d_.prefix == PrefixShape::kTenants ? "tenant-" + std::to_string(p) : "";
    ChainBuilder b(hashing::namespace_root(model_, salt));
    std::uint32_t prefix = 0;
    if (d_.prefix != PrefixShape::kNone) {
      // Tools vary in length around the drawn size (a quarter of it to all of it); the others use it as drawn.
      prefix = d_.prefix_tokens;
      if (d_.prefix == PrefixShape::kZipfTools) {
        SplitMix len(segment_id(41, d_.seed, p));
        prefix = std::max<std::uint32_t>(kBlockTokens, static_cast<std::uint32_t>(prefix * (0.25 + 0.75 * len.uniform())));
      }
      b.append(segment_id(40, d_.seed, p), prefix);
    }
    const std::string key = model_ + "/p" + std::to_string(p) + "/u" + std::to_string(u);
    Unit out;
    const std::uint64_t session = d_.sessions == SessionShape::kNone ? 0 : u + 1;
    std::size_t turns = 1;
    if (d_.sessions == SessionShape::kChat) turns = rng_.range(2, 12);
    if (d_.sessions == SessionShape::kAgents) turns = 1000;  // until the context is full
    double offset = 0;
    for (std::size_t turn = 0; turn < turns; ++turn) {
      // What the user (or the tool) adds this turn: a question, a message, a tool result.
      std::uint32_t added = static_cast<std::uint32_t>(rng_.range(32, 1024));
      if (d_.sessions == SessionShape::kAgents && turn > 0) added = static_cast<std::uint32_t>(rng_.range(512, 4096));
      if (d_.prefix == PrefixShape::kNone && turn == 0) added = static_cast<std::uint32_t>(rng_.range(256, 4096));
      const std::uint32_t out_tokens =
          static_cast<std::uint32_t>(d_.long_outputs ? rng_.range(256, 2048) : rng_.range(16, 256));
      if (turn > 0 && d_.sessions == SessionShape::kAgents && b.tokens() + added + out_tokens > d_.max_context) break;
      const std::uint32_t before = b.tokens();
      b.append(segment_id(42, d_.seed, u, turn), added);
      out.new_tokens.push_back(turn == 0 ? added : b.tokens() - before + out.requests.back().output_tokens);
      out.requests.push_back(turn_request(b, segment_id(43, d_.seed, u, turn), out_tokens, offset, session, key));
      // The next message comes after the answer (out x 30 ms of decoding at a busy worker's pace) and the
      // user's think time (chat, 5 s mean) or the tool's run time (agents, 1 s mean).
      offset += out_tokens * 0.03 + rng_.exponential(d_.sessions == SessionShape::kAgents ? 1.0 : 5.0);
    }
    return out;
  }

 private:
  const FamilyDraw& d_;
  const std::string& model_;
  SplitMix rng_;
  Zipf popularity_;
};

// Worker-seconds one request costs at the fleet's best: its new tokens prefilled after its cached context
// (the engine's own step-time model, the fixed per-step overhead left out since steps are shared), and its
// share of decode steps at the largest batch the KV pool holds (architecture section 8).
class WorkModel {
 public:
  WorkModel(const sim::EngineConfig& cfg, double mean_context) : engine_(cfg) {
    const sim::EngineStats st = engine_.stats();
    const double pool = static_cast<double>(st.num_gpu_blocks) * st.block_tokens;
    const double batch = std::clamp(std::floor(pool / std::max(mean_context, 1.0)), 1.0,
                                    static_cast<double>(cfg.max_num_seqs));
    const std::vector<std::uint32_t> ctx(static_cast<std::size_t>(batch), static_cast<std::uint32_t>(mean_context));
    decode_per_token_s_ = engine_.step_time({}, ctx) / batch;
    overhead_s_ = engine_.step_time({}, {});
  }
  double seconds(std::uint32_t new_tokens, std::uint32_t context, std::uint32_t out) const {
    const std::pair<std::uint32_t, std::uint32_t> chunk[1] = {{new_tokens, context}};
    return std::max(0.0, engine_.step_time(chunk, {}) - overhead_s_) + out * decode_per_token_s_;
  }

 private:
  sim::Engine engine_;
  double decode_per_token_s_ = 0, overhead_s_ = 0;
};

}  // namespace

Result<Workload> generate_family(const FamilyDraw& d, const FamilyFleet& fleet) {
  if (d.requests == 0) return make_error("family: no requests to draw");
  if (fleet.workers == 0) return make_error("family: the fleet has no workers");
  Builder builder(d, fleet.model);
  std::vector<Unit> units;
  std::size_t n = 0;
  double context_sum = 0;
  for (std::uint64_t u = 0; n < d.requests; ++u) {
    units.push_back(builder.unit(u));
    for (const Request& r : units.back().requests) context_sum += r.prompt_tokens + r.output_tokens / 2.0;
    n += units.back().requests.size();
  }
  const WorkModel work(fleet.engine, context_sum / static_cast<double>(n));
  double total_s = 0;
  for (const Unit& un : units)
    for (std::size_t k = 0; k < un.requests.size(); ++k) {
      const Request& r = un.requests[k];
      total_s += work.seconds(un.new_tokens[k], r.prompt_tokens - un.new_tokens[k], r.output_tokens);
    }
  // Unit start times at one per second (Poisson, or bursts of 2-32 starts 50 ms apart on average, with the
  // gaps between bursts stretched so the mean rate stays one per second), then scaled so that the offered
  // work, total_s over the span of arrivals, is load x workers.
  SplitMix rng(d.seed ^ 0x415252495645ull);
  std::vector<double> starts;
  double t = 0;
  while (starts.size() < units.size()) {
    if (d.arrivals == ArrivalShape::kPoisson) {
      t += rng.exponential(1.0);
      starts.push_back(t);
      continue;
    }
    const auto burst = static_cast<std::size_t>(rng.range(2, 32));
    t += rng.exponential(static_cast<double>(burst));
    for (std::size_t k = 0; k < burst && starts.size() < units.size(); ++k) starts.push_back(t + rng.exponential(0.05));
  }
  // The span of arrivals is the span of starts (scaled) plus the sessions' own turns: scale the starts so that
  // the whole span is the target. A session longer than the target (long answers, think times) has its turns
  // brought closer first (`pace` < 1), to half the target.
  const double target = total_s / (d.load * static_cast<double>(fleet.workers));
  std::vector<double> last(units.size(), 0.0);
  double longest = 0;
  for (std::size_t k = 0; k < units.size(); ++k) {
    for (const Request& r : units[k].requests) last[k] = std::max(last[k], r.arrival_s);
    longest = std::max(longest, last[k]);
  }
  const double pace = longest > target / 2 ? target / 2 / longest : 1.0;
  auto span = [&](double scale) {
    double lo = INFINITY, hi = 0;
    for (std::size_t k = 0; k < units.size(); ++k) {
      lo = std::min(lo, starts[k] * scale);
      hi = std::max(hi, starts[k] * scale + last[k] * pace);
    }
    return hi - lo;
  };
  double lo = 0, hi = 1;
  while (span(hi) < target && hi < 1e12) hi *= 2;
  for (int it = 0; it < 60; ++it) {
    const double mid = (lo + hi) / 2;
    (span(mid) < target ? lo : hi) = mid;
  }
  const double scale = hi;
  Workload w;
  w.name = "family-" + std::to_string(d.seed);
  w.description = d.describe();
  w.has_sessions = d.sessions != SessionShape::kNone;
  for (std::size_t k = 0; k < units.size(); ++k)
    for (Request& r : units[k].requests) {
      r.arrival_s = r.arrival_s * pace + starts[k] * scale;
      w.requests.push_back(std::move(r));
    }
  finalize(w, d.requests);
  return w;
}

}  // namespace kvroute::bench
