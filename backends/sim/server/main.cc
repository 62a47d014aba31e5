// kvroute-sim: a simulated vLLM worker fleet in one process. See options.cc (--help) for the flags.
#include <iostream>
#include <string_view>
#include <vector>

#include "backends/sim/server/options.h"
#include "backends/sim/server/plan_command.h"
#include "backends/sim/server/server.h"

int main(int argc, char** argv) {
  std::vector<std::string_view> args(argv + 1, argv + argc);
  if (!args.empty() && args[0] == "kv-size") {
    return kvroute::sim::run_kv_size({args.begin() + 1, args.end()});
  }
  if (!args.empty() && args[0] == "plan") {
    return kvroute::sim::run_plan({args.begin() + 1, args.end()});
  }
  auto options = kvroute::sim::parse_sim_options(args);
  if (!options) {
    std::cerr << "kvroute-sim: " << options.error().message << "\n";
    return 2;
  }
  if (options->help) {
    std::cout << kvroute::sim::kUsage;
    return 0;
  }
  auto server = kvroute::sim::SimServer::build(*options);
  if (!server) {
    std::cerr << "kvroute-sim: " << server.error().message << "\n";
    return 2;
  }
  std::cerr << "kvroute-sim: " << options->workers << " worker(s) on " << options->host << ":" << options->port
            << (options->workers > 1 ? "+" : "") << ", speed " << options->speed << "\n";
  server.value()->run();
  return 0;
}
