// libFuzzer entry point of one fuzz target, chosen at build time: KVROUTE_FUZZ_TARGET names it and
// KVROUTE_FUZZ_SET is the function listing its set (event_fuzz_targets or router_fuzz_targets).
#include <cstdlib>

#include "tests/fuzz/targets.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const kvroute::fuzz::FuzzTarget* target = [] {
    const auto* t = kvroute::fuzz::find_fuzz_target(kvroute::fuzz::KVROUTE_FUZZ_SET(), KVROUTE_FUZZ_TARGET);
    if (t == nullptr) std::abort();
    return t;
  }();
  target->run(data, size);
  return 0;
}
