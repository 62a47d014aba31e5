#include "bench/mooncake.h"

#include <boost/json.hpp>

#include <cstring>
#include <fstream>
#include <sstream>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace kvroute::bench {
namespace {

void put_u64(unsigned char* out, std::uint64_t v) {
  for (int k = 0; k < 8; ++k) out[k] = static_cast<unsigned char>(v >> (8 * k));
}

// A JSON number that must be a non-negative integer (Mooncake writes integers; tolerate 12.0).
bool as_count(const boost::json::value& v, std::uint64_t& out) {
  if (v.is_uint64()) { out = v.get_uint64(); return true; }
  if (v.is_int64()) { if (v.get_int64() < 0) return false; out = static_cast<std::uint64_t>(v.get_int64()); return true; }
  if (v.is_double()) {
    const double d = v.get_double();
    if (d < 0 || d != static_cast<double>(static_cast<std::uint64_t>(d))) return false;
    out = static_cast<std::uint64_t>(d);
    return true;
  }
  return false;
}

}  // namespace

hashing::BlockChain expand_hash_ids(std::uint64_t root, const std::vector<std::uint64_t>& hash_ids,
                                    std::uint32_t input_length, std::uint64_t line_number) {
  hashing::BlockChain chain;
  chain.root = root;
  chain.unit = hashing::Unit::kToken;
  chain.block_units = kBlockTokens;
  chain.total_units = input_length;
  const std::size_t blocks = input_length / kBlockTokens;
  constexpr std::size_t kPerId = kMooncakeBlockTokens / kBlockTokens;
  chain.hashes.reserve(blocks);
  hashing::BlockHash parent = root;
  unsigned char buf[24];
  for (std::size_t i = 0; i < hash_ids.size() && chain.hashes.size() < blocks; ++i) {
    put_u64(buf, hash_ids[i]);
    for (std::size_t j = 0; j < kPerId && chain.hashes.size() < blocks; ++j) {
      put_u64(buf + 8, j);
      parent = hashing::hash_block(parent, buf, 16);
      chain.hashes.push_back(parent);
    }
  }
  put_u64(buf, kUniqueTag);
  put_u64(buf + 8, line_number);
  for (std::size_t j = 0; chain.hashes.size() < blocks; ++j) {
    put_u64(buf + 16, j);
    parent = hashing::hash_block(parent, buf, 24);
    chain.hashes.push_back(parent);
  }
  return chain;
}

Result<Workload> parse_mooncake_trace(std::string_view text, std::string_view source, const MooncakeOptions& options) {
  Workload w;
  const std::uint64_t root = hashing::namespace_root(options.model, "");
  std::uint64_t line_no = 0;
  std::vector<std::uint64_t> ids;
  std::size_t pos = 0;
  auto fail = [&](const std::string& what) {
    return make_error(std::string(source) + " line " + std::to_string(line_no) + ": " + what);
  };
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == std::string_view::npos) continue;
    // Stop early once enough requests are read, unless the file may be out of order: traces are written in
    // timestamp order, and finalize() sorts anyway, so a truncated read of a sorted file is exact.
    if (options.max_requests > 0 && w.requests.size() >= options.max_requests) break;

    boost::system::error_code ec;
    boost::json::value v = boost::json::parse(line, ec);
    if (ec) return fail("not valid JSON (" + ec.message() + ")");
    if (!v.is_object()) return fail("expected a JSON object");
    const auto& o = v.get_object();
    auto field = [&](const char* name) -> const boost::json::value* { return o.if_contains(name); };

    Request r;
    const auto* ts = field("timestamp");
    if (!ts) return fail("missing 'timestamp'");
    if (!ts->is_number()) return fail("'timestamp' must be a number (milliseconds)");
    const double ms = ts->to_number<double>();
    if (!(ms >= 0)) return fail("'timestamp' must be >= 0");
    r.arrival_s = ms / 1000.0;

    std::uint64_t n = 0;
    const auto* in = field("input_length");
    if (!in) return fail("missing 'input_length'");
    if (!as_count(*in, n) || n > 0xffffffffu) return fail("'input_length' must be a non-negative integer");
    r.prompt_tokens = static_cast<std::uint32_t>(n);
    const auto* out = field("output_length");
    if (!out) return fail("missing 'output_length'");
    if (!as_count(*out, n) || n > 0xffffffffu) return fail("'output_length' must be a non-negative integer");
    // An engine always produces at least one token (the first token is what TTFT measures).
    r.output_tokens = static_cast<std::uint32_t>(std::max<std::uint64_t>(n, 1));

    const auto* hs = field("hash_ids");
    if (!hs) return fail("missing 'hash_ids'");
    if (!hs->is_array()) return fail("'hash_ids' must be an array of integers");
    ids.clear();
    for (const auto& h : hs->get_array()) {
      if (!as_count(h, n)) return fail("'hash_ids' must be an array of non-negative integers");
      ids.push_back(n);
    }
    r.chain = expand_hash_ids(root, ids, r.prompt_tokens, line_no);

    if (const auto* s = field("session_id"); s && !s->is_null()) {
      std::string key = s->is_string() ? std::string(s->get_string()) : boost::json::serialize(*s);
      r.session = XXH3_64bits(key.data(), key.size()) | 1;  // never 0 (0 means "no session")
    }
    // chwbl's key stands for "model + the start of the first user message": the first two 512-token ids
    // (in the conversation trace id 0 is a system prompt every request shares, the next id starts the
    // conversation itself).
    r.affinity_key = options.model;
    for (std::size_t i = 0; i < ids.size() && i < 2; ++i) r.affinity_key += "/" + std::to_string(ids[i]);
    w.requests.push_back(std::move(r));
  }
  finalize(w, options.max_requests);
  return w;
}

Result<Workload> read_mooncake_trace(const std::string& path, const MooncakeOptions& options) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error("cannot open trace '" + path + "': " + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  std::string base = path.substr(path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/') + 1);
  std::string name = base.substr(0, base.find('.'));
  auto w = parse_mooncake_trace(ss.str(), base, options);
  if (w) w->name = name;
  return w;
}

}  // namespace kvroute::bench
