// Helpers shared by the events tests: hex literals for byte-exact frames.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace kvroute::events::testing {

// "93 01 c0" -> {0x93, 0x01, 0xc0}; spaces and newlines are ignored; 'quoted text' inserts its ASCII bytes
// (so strings in frames stay readable).
inline std::vector<std::uint8_t> hex(std::string_view s) {
  std::vector<std::uint8_t> out;
  auto nib = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\'') {
      for (++i; i < s.size() && s[i] != '\''; ++i) out.push_back(static_cast<std::uint8_t>(s[i]));
      continue;
    }
    const int hi = nib(s[i]);
    if (hi < 0) continue;
    const int lo = i + 1 < s.size() ? nib(s[i + 1]) : -1;
    if (lo < 0) continue;
    out.push_back(static_cast<std::uint8_t>(hi * 16 + lo));
    ++i;
  }
  return out;
}

}  // namespace kvroute::events::testing
