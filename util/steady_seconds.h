// steady_seconds(): a steady-clock time as seconds since the clock's epoch, the time the prefill queues,
// prefix holds and shared load are kept in (comparable only within one process).
//
//   const double now_s = steady_seconds(std::chrono::steady_clock::now());
#pragma once

#include <chrono>

namespace kvroute {

inline double steady_seconds(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(t.time_since_epoch()).count();
}

}  // namespace kvroute
