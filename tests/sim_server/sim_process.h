// Test helpers for kvroute-sim end-to-end tests: start the real binary on free loopback ports, talk HTTP
// to it, and read msgpack without any library.
//
//   SimProcess sim({"--speed", "100"});          // ports picked here; ASSERT_TRUE(sim.ready())
//   HttpReply r = http_call(sim.port(), "POST", "/v1/completions", R"({"prompt":"hi"})");
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

namespace kvroute::sim::testing {

// A free TCP port on 127.0.0.1 such that `count` consecutive ports starting there are free right now.
std::uint16_t free_port_range(int count);

class SimProcess {
 public:
  // Starts $KVROUTE_BIN_DIR/kvroute-sim --host 127.0.0.1 --port P <args> and waits for /health on every
  // worker (`workers` of them).
  explicit SimProcess(std::vector<std::string> args, int workers = 1);
  ~SimProcess();  // SIGTERM, then SIGKILL after 5 s
  bool ready() const { return ready_; }
  std::uint16_t port(int worker = 0) const { return static_cast<std::uint16_t>(port_ + worker); }
  bool alive() const;
  // Sends SIGTERM and waits; returns the exit status (or -1).
  int terminate();

 private:
  pid_t pid_ = -1;
  std::uint16_t port_ = 0;
  bool ready_ = false;
};

struct HttpReply {
  int status = 0;  // 0: connection failed
  std::string body;
  std::string content_type;
  std::string error;
};

// `authorization`, when not empty, is sent as the Authorization header.
HttpReply http_call(std::uint16_t port, const std::string& method, const std::string& target,
                    const std::string& body = "", const std::string& authorization = "");

// Splits an SSE body into the payloads of its "data: " lines.
std::vector<std::string> sse_data(const std::string& body);

// Splits an SSE body into its events: the "event: " name ("" when the event has none) and the "data: "
// payload. (The Responses API names its events; chat and completions do not.)
struct SseEvent {
  std::string event;
  std::string data;
};
std::vector<SseEvent> sse_events(const std::string& body);

// A decoded msgpack value (tests only).
struct Msg {
  using Array = std::vector<Msg>;
  using Map = std::vector<std::pair<Msg, Msg>>;
  std::variant<std::monostate, bool, std::int64_t, std::uint64_t, double, std::string, Array, Map> v;
  bool is_nil() const { return v.index() == 0; }
  const Array& array() const { return std::get<Array>(v); }
  const Map& map() const { return std::get<Map>(v); }
  const std::string& str() const { return std::get<std::string>(v); }
  // Any integer as its 64-bit pattern.
  std::uint64_t bits() const;
  const Msg* get(const std::string& key) const;  // map lookup by string key
};

// Decodes one complete value; false on malformed input or trailing bytes.
bool msgpack_decode(const std::string& bytes, Msg& out);

}  // namespace kvroute::sim::testing
