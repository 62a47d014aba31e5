// Minimal leveled logging to stderr, one line per event with a UTC timestamp. Thread-safe (one write per line).
//
//   LOG_INFO("worker " << name << " is healthy again");
#pragma once

#include <chrono>
#include <sstream>
#include <string>

namespace kvroute::log {

enum class Level { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };
void set_level(const std::string& name);
bool enabled(Level l);
void write(Level l, const std::string& line);
// "2026-01-31T12:34:56.789Z": the UTC time, to the millisecond, as each log line starts.
std::string timestamp(std::chrono::system_clock::time_point t);

}  // namespace kvroute::log

#define KVROUTE_LOG(level, expr)                                 \
  do {                                                           \
    if (::kvroute::log::enabled(level)) {                        \
      std::ostringstream kvroute_log_ss;                         \
      kvroute_log_ss << expr;                                    \
      ::kvroute::log::write(level, kvroute_log_ss.str());        \
    }                                                            \
  } while (0)
#define LOG_ERROR(expr) KVROUTE_LOG(::kvroute::log::Level::kError, expr)
#define LOG_WARN(expr) KVROUTE_LOG(::kvroute::log::Level::kWarn, expr)
#define LOG_INFO(expr) KVROUTE_LOG(::kvroute::log::Level::kInfo, expr)
#define LOG_DEBUG(expr) KVROUTE_LOG(::kvroute::log::Level::kDebug, expr)
