// Workload: the arrivals a fleet simulation replays, whatever their source (a Mooncake trace or a built-in
// generator). Every request carries its prompt as a 16-token block chain (hashing/block_chain.h), so the
// simulator hands the same hashes to the router's PrefixIndex and to the simulated engines, exactly as the
// daemon would hash a tokenized prompt.
//
//   Result<Workload> w = read_mooncake_trace("conversation_trace.jsonl", MooncakeOptions{});
//   for (const Request& r : w->requests) use(r.arrival_s, r.chain.hashes, r.prompt_tokens);
//
// Contract: requests are sorted by arrival time (stable: equal times keep their source order); `id` is the
// position in that order; chains hold one hash per FULL 16-token block of the prompt.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hashing/block_chain.h"

namespace kvroute::bench {

inline constexpr std::uint32_t kBlockTokens = 16;

struct Request {
  std::uint64_t id = 0;
  double arrival_s = 0;             // virtual seconds from the start of the workload
  std::uint32_t prompt_tokens = 0;
  std::uint32_t output_tokens = 1;  // tokens the engine generates (the request's max_tokens)
  hashing::BlockChain chain;        // 16-token blocks, chained from the model's namespace root
  // Hashes continuing the chain over the tokens the request will generate, when the source knows them
  // (generators do, traces do not): the engine caches decoded blocks, so a chat's next turn hits them.
  std::vector<hashing::BlockHash> output_blocks;
  std::uint64_t session = 0;        // session key for affinity; 0 = none
  std::string affinity_key;         // what chwbl hashes: model + the start of the first user message
};

struct Workload {
  std::string name;
  std::string description;  // how a drawn workload was drawn (bench/family.h), empty otherwise
  std::vector<Request> requests;
  bool has_sessions = false;

  std::uint64_t prompt_tokens() const;
  std::uint64_t output_tokens() const;
  double duration_s() const { return requests.empty() ? 0.0 : requests.back().arrival_s; }
};

// Sorts by arrival (stable), keeps the first `max_requests` (0 = all) and renumbers ids; generators and
// readers call it last. (Rate scaling is applied by the simulator, so one loaded workload serves a sweep.)
void finalize(Workload& w, std::size_t max_requests = 0);

}  // namespace kvroute::bench
