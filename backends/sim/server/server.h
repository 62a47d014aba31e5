// SimServer: the kvroute-sim process: N simulated workers on one io_context thread, until SIGINT/SIGTERM.
//
// Contract: build() validates the options against the profiles and binds every port (HTTP P+i, KV events
// BASE+i, replay R+i) before anything runs, so a bad flag or a busy port fails fast with a message;
// run() blocks on the calling thread until a signal (or stop()) and returns after a clean shutdown.
//
//   auto server = SimServer::build(options);
//   if (!server) { std::cerr << server.error().message << "\n"; return 2; }
//   server.value()->run();
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>

#include <memory>
#include <string>
#include <vector>

#include "backends/sim/engine.h"
#include "backends/sim/server/options.h"
#include "backends/sim/server/worker.h"
#include "util/result.h"

namespace kvroute::sim {

// The engine configuration the options describe (profiles, overrides); errors name the flag.
Result<EngineConfig> engine_config_from(const SimServerOptions& options);

class SimServer {
 public:
  static Result<std::unique_ptr<SimServer>> build(const SimServerOptions& options);
  ~SimServer();
  void run();
  void stop();  // thread-safe: posts the shutdown onto the io thread
  const std::vector<std::shared_ptr<SimWorker>>& workers() const { return workers_; }

 private:
  SimServer();
  // Declared first so it is destroyed last: the io_context's destruction releases the last sessions, hence
  // the workers and their ZMQ sockets, and zmq_ctx_term waits for every socket to be closed.
  struct ZmqContext {
    void* ctx = nullptr;
    ~ZmqContext();
  } zmq_;
  boost::asio::io_context io_{1};  // one thread: the concurrency hint lets Asio skip locking
  boost::asio::signal_set signals_{io_};
  std::vector<std::shared_ptr<SimWorker>> workers_;
};

// `kvroute-sim kv-size CONFIG.json|MODEL [--gpu NAME]`: prints the report, returns the exit status.
int run_kv_size(const std::vector<std::string_view>& args);

}  // namespace kvroute::sim
