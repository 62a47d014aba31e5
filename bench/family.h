// The workload family behind `kvroute-bench simulate --workload family --seed N`: one seed draws one workload
// at random from wide ranges, so that a policy is judged on shapes nobody tuned it for (architecture section 10).
// Every draw is printed (FamilyDraw::describe) and names its instance: the same seed gives the same workload,
// bit for bit, on every platform (integer PRNG arithmetic only, as bench/generators.h).
//
// What is drawn:
//   load       offered work over the fleet's capacity, 0.15 to 1.2 (light to past saturation); capacity is the
//              work a fleet of `workers` engines does per second with every shared prefix cached (so a policy
//              that loses prefixes saturates earlier), priced with the engine's own step-time model
//   prefix     none, one prefix shared by everything, many tenants (each its own cache namespace), Zipf-popular
//              tools, long documents shared by many questions (Zipf popularity)
//   prefix_tokens  shared-prefix length, log-uniform 1K-100K tokens (documents: 16K-100K)
//   sessions   none, chat (2-12 turns, think time), agents (tool results appended turn after turn until the
//              context reaches 32K-128K tokens)
//   arrivals   Poisson, or bursts (groups of 2-32 arrivals close together, same mean rate)
//   outputs    short (16-256 tokens) or long (256-2048)
//
//   FamilyDraw d = draw_family(7);
//   std::cerr << d.describe();
//   Result<Workload> w = generate_family(d, FamilyFleet::from(sim_options));
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "backends/sim/engine.h"
#include "bench/workload.h"
#include "util/result.h"

namespace kvroute::bench {

enum class PrefixShape : std::uint8_t { kNone, kShared, kTenants, kZipfTools, kDocuments };
enum class SessionShape : std::uint8_t { kNone, kChat, kAgents };
enum class ArrivalShape : std::uint8_t { kPoisson, kBursty };
std::string_view name_of(PrefixShape s);
std::string_view name_of(SessionShape s);
std::string_view name_of(ArrivalShape s);

struct FamilyDraw {
  std::uint64_t seed = 1;
  double load = 1.0;                // offered work / fleet capacity
  PrefixShape prefix = PrefixShape::kNone;
  std::uint32_t prefix_tokens = 0;  // length of the shared prefix (0 with kNone), a multiple of 16
  std::uint32_t prefixes = 1;       // how many distinct prefixes (tenants, tools, documents)
  double zipf_s = 0;                // popularity exponent of the prefixes (tools, documents, tenants)
  SessionShape sessions = SessionShape::kNone;
  std::uint32_t max_context = 0;    // agents: the context a session grows to
  ArrivalShape arrivals = ArrivalShape::kPoisson;
  bool long_outputs = false;
  std::size_t requests = 1000;

  // One line naming the instance: "family seed=7 load=0.83 prefix=documents(24 x 41232 tok, zipf 1.1) ...".
  std::string describe() const;
};

FamilyDraw draw_family(std::uint64_t seed);

// What the load is relative to: the fleet the workload will run on.
struct FamilyFleet {
  std::size_t workers = 8;
  sim::EngineConfig engine;
  std::string model = "qwen3-8b";  // namespace of the chains (as GeneratorOptions::model)
};

// The draw's requests (at most d.requests; 0 is refused), with arrival times set so that the offered work is
// d.load x the fleet's capacity. Workload::name is "family-<seed>", Workload::description d.describe().
Result<Workload> generate_family(const FamilyDraw& d, const FamilyFleet& fleet);

}  // namespace kvroute::bench
