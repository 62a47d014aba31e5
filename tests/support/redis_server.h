// A real redis-server for tests of replicas sharing state: on loopback, on a free port, without persistence.
//
//   if (!redis_available()) GTEST_SKIP() << "redis-server is not installed";
//   Redis redis;                       // started, answering PING
//   ... "--shared-state", redis.url() ...
#pragma once

#include <string>
#include <utility>

#include "tests/support/harness.h"

namespace kvroute::test {

// Whether redis-server is installed (scripts/setup.sh installs it).
bool redis_available();

// One redis-server; restartable on the same port.
class Redis {
 public:
  Redis();
  // Starts it (again) and waits up to 10 s for it to answer PING.
  void start();
  void kill() { proc_.kill_now(); }
  // An inline command's raw reply (the connection is closed after it).
  std::string command(const std::string& cmd) const;
  // Calls and bytes of the commands Redis served so far (INFO commandstats, INFO stats).
  std::pair<double, double> calls_and_bytes() const;
  // CPU seconds redis-server has used (INFO cpu: used_cpu_sys + used_cpu_user).
  double cpu_seconds() const;
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }
  int port() const { return port_; }

 private:
  int port_;
  Process proc_;
};

}  // namespace kvroute::test
