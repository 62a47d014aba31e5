// Test harness for end-to-end tests: real processes on loopback and a small blocking HTTP client.
//
//   auto sim = Process::start({bin("kvroute-sim"), "--port", std::to_string(p), "--workers", "3"});
//   ASSERT_TRUE(wait_http(p, "/health", 10s));
//   auto r = http("127.0.0.1", p, "POST", "/v1/completions", R"({"model":"m","prompt":"hi"})");
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace kvroute::test {

// Path of a built binary (KVROUTE_BIN_DIR is set by ctest; falls back to ./bin next to the test's folder).
std::string bin(const std::string& name);
std::string source_dir();

class Process {
 public:
  static Process start(const std::vector<std::string>& argv, const std::string& log_file = "");
  Process() = default;
  Process(Process&& o) noexcept : pid_(o.pid_) { o.pid_ = -1; }
  Process& operator=(Process&& o) noexcept;
  ~Process() { stop(); }
  void stop(int signal = 15);  // SIGTERM, then SIGKILL after 3 s
  void kill_now();             // SIGKILL
  bool running() const;
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
};

// Ports from a range that does not collide with other tests run in parallel (by pid).
int free_port();
// A block of `n` consecutive free ports.
int free_ports(int n);

bool wait_http(int port, const std::string& path, std::chrono::milliseconds timeout);

// Plain blocking sockets on 127.0.0.1, for raw peers (a worker that answers bytes of its own, a client that sends
// nothing): a listening socket on `port` (SO_REUSEADDR), or a connected one; -1 on failure.
int listen_loopback(int port, int backlog = 64);
int connect_loopback(int port);

struct HttpResponse {
  int status = 0;  // 0: transport error (see error)
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
  std::string error;
  std::string header(const std::string& name) const;
};

HttpResponse http(int port, const std::string& method, const std::string& target, const std::string& body = "",
                  const std::map<std::string, std::string>& headers = {}, std::chrono::milliseconds timeout =
                                                                              std::chrono::seconds(30));

// Sends a request and calls on_piece for each body piece as it arrives (with the time it arrived).
HttpResponse http_stream(int port, const std::string& method, const std::string& target, const std::string& body,
                         const std::map<std::string, std::string>& headers,
                         const std::function<void(const std::string&, std::chrono::steady_clock::time_point)>& on_piece);

// The sum of a metric's samples in Prometheus text: `name` with or without labels, or one labelled series
// when `name` has them.
double metric_sum(const std::string& text, const std::string& name);

// Raw bytes to a port; returns what the server answered until it closed or `timeout` passed.
std::string raw_exchange(int port, const std::string& bytes, std::chrono::milliseconds timeout = std::chrono::seconds(5));

}  // namespace kvroute::test
