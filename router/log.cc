#include "router/log.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <ctime>

namespace kvroute::log {

namespace {
std::atomic<int> g_level{static_cast<int>(Level::kInfo)};
const char* kNames[] = {"error", "warn", "info", "debug"};
}  // namespace

void set_level(const std::string& name) {
  for (int i = 0; i < 4; ++i) {
    if (name == kNames[i]) g_level = i;
  }
}

bool enabled(Level l) { return static_cast<int>(l) <= g_level.load(std::memory_order_relaxed); }

std::string timestamp(std::chrono::system_clock::time_point now) {
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &tm);
  return std::string(stamp) + "." + std::to_string(1000 + ms).substr(1) + "Z";
}

void write(Level l, const std::string& line) {
  std::string out = timestamp(std::chrono::system_clock::now()) + " " + kNames[static_cast<int>(l)] + " " + line + "\n";
  [[maybe_unused]] auto n = ::write(2, out.data(), out.size());
}

}  // namespace kvroute::log
