#include "tests/support/redis_server.h"

#include <unistd.h>

#include <chrono>
#include <thread>

#include <gtest/gtest.h>

namespace kvroute::test {
namespace {

using namespace std::chrono_literals;

const char* kRedisServer = "/usr/bin/redis-server";

// The number after "NAME:" in an INFO reply (0 when absent).
double info_field(const std::string& info, const std::string& name) {
  const auto pos = info.find(name + ":");
  return pos == std::string::npos ? 0.0 : std::stod(info.substr(pos + name.size() + 1));
}

}  // namespace

bool redis_available() { return ::access(kRedisServer, X_OK) == 0; }

Redis::Redis() : port_(free_port()) { start(); }

void Redis::start() {
  proc_ = Process::start({kRedisServer, "--port", std::to_string(port_), "--bind", "127.0.0.1", "--save", "",
                          "--appendonly", "no"},
                         testing::TempDir() + "/kvroute-redis-" + std::to_string(port_) + ".log");
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (command("PING").find("+PONG") == std::string::npos && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(20ms);
  }
}

std::string Redis::command(const std::string& cmd) const { return raw_exchange(port_, cmd + "\r\nQUIT\r\n", 2s); }

std::pair<double, double> Redis::calls_and_bytes() const {
  const std::string stats = command("INFO commandstats");
  double calls = 0;
  for (auto pos = stats.find("calls="); pos != std::string::npos; pos = stats.find("calls=", pos + 1)) {
    calls += std::stod(stats.substr(pos + 6));
  }
  const std::string net = command("INFO stats");
  return {calls, info_field(net, "total_net_input_bytes") + info_field(net, "total_net_output_bytes")};
}

double Redis::cpu_seconds() const {
  const std::string info = command("INFO cpu");
  return info_field(info, "used_cpu_sys") + info_field(info, "used_cpu_user");
}

}  // namespace kvroute::test
