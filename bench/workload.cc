#include "bench/workload.h"

#include <algorithm>

namespace kvroute::bench {

std::uint64_t Workload::prompt_tokens() const {
  std::uint64_t s = 0;
  for (const auto& r : requests) s += r.prompt_tokens;
  return s;
}

std::uint64_t Workload::output_tokens() const {
  std::uint64_t s = 0;
  for (const auto& r : requests) s += r.output_tokens;
  return s;
}

void finalize(Workload& w, std::size_t max_requests) {
  std::stable_sort(w.requests.begin(), w.requests.end(),
                   [](const Request& a, const Request& b) { return a.arrival_s < b.arrival_s; });
  if (max_requests > 0 && w.requests.size() > max_requests) w.requests.resize(max_requests);
  w.has_sessions = false;
  for (std::size_t i = 0; i < w.requests.size(); ++i) {
    w.requests[i].id = i;
    if (w.requests[i].session != 0) w.has_sessions = true;
  }
}

}  // namespace kvroute::bench
