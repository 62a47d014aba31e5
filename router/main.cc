// kvroute: parse configuration, build the components, run until SIGINT/SIGTERM.
#include <iostream>
#include <memory>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>

#include "router/app.h"
#include "router/config.h"
#include "router/log.h"

int main(int argc, char** argv) {
  bool help = false;
  auto cfg = kvroute::router::load_config(argc, argv, &help);
  if (help) {
    std::cout << kvroute::router::help_text();
    return 0;
  }
  if (!cfg) {
    std::cerr << "kvroute: " << cfg.error().message << "\n";
    return 2;
  }
  kvroute::log::set_level(cfg->log_level);
  const int threads = cfg->threads > 0 ? cfg->threads : std::max(1u, std::thread::hardware_concurrency());
  // One io_context per thread (share-nothing data path, see router/app.h).
  std::vector<std::unique_ptr<boost::asio::io_context>> contexts;
  for (int i = 0; i < threads; ++i) contexts.push_back(std::make_unique<boost::asio::io_context>(1));
  auto& io = *contexts.front();
  kvroute::router::App app(contexts, *cfg);
  if (auto started = app.start(); !started) {
    std::cerr << "kvroute: " << started.error().message << "\n";
    return 1;
  }
  boost::asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](const boost::system::error_code&, int) {
    LOG_INFO("shutting down");
    app.stop();
    for (auto& c : contexts) c->stop();
  });
  std::vector<std::thread> pool;
  for (int i = 1; i < threads; ++i) pool.emplace_back([&contexts, i] { contexts[i]->run(); });
  io.run();
  for (auto& t : pool) t.join();
  return 0;
}
