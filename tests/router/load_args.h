// The configuration as kvroute's command line would give it: load_args({"--policy", "kv_cost"}).
#pragma once

#include <string>
#include <vector>

#include "router/config.h"

namespace kvroute::router {

inline Result<Config> load_args(const std::vector<std::string>& args) {
  std::vector<const char*> argv{"kvroute"};
  for (const auto& a : args) argv.push_back(a.c_str());
  return load_config(static_cast<int>(argv.size()), argv.data());
}

}  // namespace kvroute::router
