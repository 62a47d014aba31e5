// split(): the items of a separated list, as views into it. Empty items are kept ("a,,b" has three), so a
// parser can reject them with a message naming what it got.
//
//   for (std::string_view item : split("qwen=/a,llama=/b", ',')) ...   // "qwen=/a", "llama=/b"
//   split("", ',')                                                      // one empty item
#pragma once

#include <string_view>
#include <vector>

namespace kvroute {

inline std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> items;
  while (true) {
    const std::size_t at = s.find(sep);
    items.push_back(s.substr(0, at));
    if (at == std::string_view::npos) return items;
    s.remove_prefix(at + 1);
  }
}

}  // namespace kvroute
