// kvroute's fuzz targets: every parser that reads bytes from outside the process (clients, workers, the
// operator's configuration), each as a function of raw bytes. fuzz_main.cc runs one of them under libFuzzer
// (a clang build with -DKVROUTE_FUZZ=ON, scripts/fuzz.sh); corpus_test.cc replays the seed corpus tests/fuzz/corpus/NAME/
// through all of them in the ordinary build, so a fixed crash stays fixed.
//
//   const FuzzTarget* t = find_fuzz_target(event_fuzz_targets(), "vllm_events");
//   t->run(data, size);   // must neither crash, leak nor hang, whatever the bytes
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace kvroute::fuzz {

struct FuzzTarget {
  std::string_view name;  // also the folder of its seeds under tests/fuzz/corpus/
  void (*run)(const std::uint8_t* data, std::size_t size);
};

// Two sets, so that the event targets link the events library alone (and build long before the router).
std::span<const FuzzTarget> event_fuzz_targets();   // targets_events.cc: vllm_events, native_events, metrics
std::span<const FuzzTarget> router_fuzz_targets();  // targets_router.cc: request, usage, config, hygiene

inline const FuzzTarget* find_fuzz_target(std::span<const FuzzTarget> set, std::string_view name) {
  for (const FuzzTarget& t : set) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

}  // namespace kvroute::fuzz
