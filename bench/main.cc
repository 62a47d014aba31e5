// kvroute-bench: fleet benchmarks of kvroute's routing policies. Subcommands:
//   simulate   discrete-event fleet simulation in virtual time (bench/runner.h has the options)
//   replay     the same arrivals over HTTP to an OpenAI-compatible endpoint (bench/replay.h)
//   family-summary  kv_cost against the best other policy over seeds of the workload family (bench/family_report.h)
#include <iostream>
#include <string>
#include <vector>

#include "bench/family_report.h"
#include "bench/replay.h"
#include "bench/runner.h"

int main(int argc, char** argv) {
  const std::string usage =
      "usage: kvroute-bench simulate --help\n       kvroute-bench replay --help\n"
      "       kvroute-bench family-summary --help\n";
  if (argc < 2) {
    std::cerr << usage;
    return 2;
  }
  const std::string cmd = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  if (cmd == "simulate") return kvroute::bench::run_simulate_command(args);
  if (cmd == "replay") return kvroute::bench::run_replay_command(args);
  if (cmd == "family-summary") return kvroute::bench::run_family_summary_command(args);
  if (cmd == "--help" || cmd == "-h") {
    std::cout << usage;
    return 0;
  }
  std::cerr << "kvroute-bench: unknown subcommand '" << cmd << "'\n" << usage;
  return 2;
}
