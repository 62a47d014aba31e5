// kvroute: parse configuration, build the components, run until SIGINT/SIGTERM (then drain and stop).
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <iostream>
#include <memory>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>

#include "router/app.h"
#include "router/config.h"
#include "router/log.h"

namespace {

// Every request in flight holds two descriptors (its client's connection and its worker's), so the soft
// limit on open files (often 1024) caps concurrent streams at about 500: take the hard limit, as the Go
// runtime does for its servers, and say so when even that is small.
void raise_open_files_limit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
  if (rl.rlim_cur < rl.rlim_max) {
    rlimit want = rl;
    want.rlim_cur = rl.rlim_max == RLIM_INFINITY ? std::max<rlim_t>(rl.rlim_cur, rlim_t{1} << 20) : rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &want) == 0) rl = want;
  }
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < 4096) {
    LOG_WARN("open-files limit " << rl.rlim_cur << " allows about " << rl.rlim_cur / 2
                                 << " requests in flight; raise it (ulimit -n, or the container's nofile limit)");
  }
}

}  // namespace

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
  raise_open_files_limit();
  if (cfg->access_log) std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each access-log line leaves at once
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
  // SIGTERM or SIGINT: drain (stop accepting, let requests in flight finish for up to --drain-timeout), then
  // stop; a second signal stops at once.
  boost::asio::signal_set signals(io, SIGINT, SIGTERM);
  boost::asio::steady_timer drain_timer(io);
  bool stopped = false;
  auto stop = [&](const char* why) {
    if (stopped) return;
    stopped = true;
    LOG_INFO("shutting down (" << why << ")");
    drain_timer.cancel();
    signals.cancel();
    app.stop();
    for (auto& c : contexts) c->stop();
  };
  std::chrono::steady_clock::time_point deadline;  // of the drain; unset until the first signal
  std::function<void()> poll_drain = [&] {
    if (app.in_flight() == 0) return stop("drained");
    if (std::chrono::steady_clock::now() >= deadline) {
      LOG_WARN("drain timeout: " << app.in_flight() << " requests still in flight are cut");
      return stop("drain timeout");
    }
    drain_timer.expires_after(std::chrono::milliseconds(50));
    drain_timer.async_wait([&](const boost::system::error_code& ec) {
      if (!ec) poll_drain();
    });
  };
  std::function<void(const boost::system::error_code&, int)> on_signal = [&](const boost::system::error_code& ec, int) {
    if (ec) return;
    if (cfg->drain_timeout_s <= 0 || deadline != std::chrono::steady_clock::time_point{}) return stop("signal");
    deadline = std::chrono::steady_clock::now() +
               std::chrono::milliseconds(static_cast<long long>(cfg->drain_timeout_s * 1000.0));
    LOG_INFO("draining: no new connections, " << app.in_flight() << " requests in flight may take up to "
                                              << cfg->drain_timeout_s << " s; a second signal stops at once");
    app.begin_drain();
    signals.async_wait(on_signal);
    poll_drain();
  };
  signals.async_wait(on_signal);
  std::vector<std::thread> pool;
  for (int i = 1; i < threads; ++i) pool.emplace_back([&contexts, i] { contexts[i]->run(); });
  io.run();
  for (auto& t : pool) t.join();
  return 0;
}
