// printf-style formatting of one number for the sizing and planning reports (profile.cc, plan.cc).
//
//   format_number("%.1f GiB", 56.69) == "56.7 GiB"
#pragma once

#include <cstdio>
#include <string>

namespace kvroute::sim::internal {

inline std::string format_number(const char* format, double value) {
  char buf[96];
  std::snprintf(buf, sizeof buf, format, value);
  return buf;
}

}  // namespace kvroute::sim::internal
