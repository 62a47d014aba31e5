// How shared records are written as Redis values (shared_state.h): block hashes as little-endian 64-bit
// words, hashes and session keys as 16 hex digits, load and rates as tab-separated text lines. The values are
// kvroute's own (no prompt text), small, and readable with redis-cli for an operator who wants to look.
//
//   std::string h = wire::pack_hashes(chain.hashes);      // 8 bytes per block
//   auto back = wire::unpack_hashes(h);                   // the same hashes
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backends/shared_state/shared_state.h"

namespace kvroute::shared_state::wire {

std::string pack_hashes(std::span<const hashing::BlockHash> hashes);
std::vector<hashing::BlockHash> unpack_hashes(std::string_view bytes);

std::string hex64(std::uint64_t v);
std::optional<std::uint64_t> parse_hex64(std::string_view s);

// One line per worker: URL, in flight, pending prefill tokens, pending prefill s, oldest prefill s, decode tokens,
// time without a first token, KV tokens in flight.
std::string pack_load(const std::vector<WorkerLoad>& load);
// Adds the lines of `text` into `sum` (by worker URL); malformed lines are skipped.
void add_load(std::string_view text, std::vector<WorkerLoad>& sum);
// Adds one worker's load into `sum` (by worker URL).
void add_load(const WorkerLoad& load, std::vector<WorkerLoad>& sum);
// The others' load per worker as of `now`, each worker's parts drained as one queue (policy::queued_at).
std::vector<WorkerLoad> queued_at(const std::vector<WorkerLoad>& parts, double now);
// The first line of a published load: "#", then how many routed records of the sender it covers. load_seq()
// reads it back (0 without one); add_load() skips it.
std::string pack_load_seq(std::uint64_t seq);
std::uint64_t load_seq(std::string_view text);
// One request's load on a routed record: pending prefill tokens and seconds, KV tokens (in flight 1).
std::string pack_share(const policy::LoadShare& l);
std::optional<policy::LoadShare> unpack_share(std::string_view text);
// A non-negative decimal number.
std::optional<std::uint64_t> parse_count(std::string_view s);

std::string pack_rates(const policy::WorkerRates& r);
std::optional<policy::WorkerRates> unpack_rates(std::string_view text);

// Stream ids "MS-SEQ" compared as numbers: negative, zero or positive like strcmp.
int compare_ids(std::string_view a, std::string_view b);

}  // namespace kvroute::shared_state::wire
