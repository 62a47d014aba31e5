#include "tests/sim_server/sim_process.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string_view>
#include <thread>

extern char** environ;

namespace kvroute::sim::testing {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;

namespace {

bool port_free(std::uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

}  // namespace

std::uint16_t free_port_range(int count) {
  static std::mt19937 rng(static_cast<unsigned>(::getpid()) * 7919u +
                          static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count()));
  std::uniform_int_distribution<int> dist(20000, 60000 - count);
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int base = dist(rng);
    bool ok = true;
    for (int i = 0; i < count && ok; ++i) ok = port_free(static_cast<std::uint16_t>(base + i));
    if (ok) return static_cast<std::uint16_t>(base);
  }
  return 0;
}

SimProcess::SimProcess(std::vector<std::string> args, int workers) {
  const char* dir = std::getenv("KVROUTE_BIN_DIR");
  const std::string bin = std::string(dir ? dir : "bin") + "/kvroute-sim";
  port_ = free_port_range(workers);
  std::vector<std::string> argv_s = {bin, "--host", "127.0.0.1", "--port", std::to_string(port_), "--workers",
                                     std::to_string(workers)};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);
  if (posix_spawn(&pid_, bin.c_str(), nullptr, nullptr, argv.data(), environ) != 0) {
    pid_ = -1;
    return;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  for (int w = 0; w < workers; ++w) {
    while (true) {
      if (!alive()) return;
      if (http_call(port(w), "GET", "/health").status == 200) break;
      if (std::chrono::steady_clock::now() > deadline) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  ready_ = true;
}

bool SimProcess::alive() const {
  if (pid_ <= 0) return false;
  int status = 0;
  return ::waitpid(pid_, &status, WNOHANG) == 0;
}

int SimProcess::terminate() {
  if (pid_ <= 0) return -1;
  ::kill(pid_, SIGTERM);
  int status = 0;
  for (int i = 0; i < 500; ++i) {
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
  return -1;
}

SimProcess::~SimProcess() { terminate(); }

HttpReply http_call(std::uint16_t port, const std::string& method, const std::string& target,
                    const std::string& body, const std::string& authorization) {
  HttpReply reply;
  net::io_context io;
  beast::tcp_stream stream(io);
  beast::error_code ec;
  stream.expires_after(std::chrono::seconds(30));
  stream.socket().connect({net::ip::make_address("127.0.0.1"), port}, ec);
  if (ec) {
    reply.error = ec.message();
    return reply;
  }
  http::request<http::string_body> req{http::string_to_verb(method), target, 11};
  req.set(http::field::host, "127.0.0.1");
  if (!authorization.empty()) req.set(http::field::authorization, authorization);
  if (!body.empty() || method == "POST") {
    req.set(http::field::content_type, "application/json");
    req.body() = body;
  }
  req.prepare_payload();
  http::write(stream, req, ec);
  if (ec) {
    reply.error = ec.message();
    return reply;
  }
  beast::flat_buffer buf;
  http::response_parser<http::string_body> parser;
  parser.body_limit(64u << 20);
  http::read(stream, buf, parser, ec);
  if (ec) {
    reply.error = ec.message();
    return reply;
  }
  reply.status = static_cast<int>(parser.get().result_int());
  reply.body = parser.get().body();
  reply.content_type = std::string(parser.get()[http::field::content_type]);
  stream.socket().shutdown(net::ip::tcp::socket::shutdown_both, ec);
  return reply;
}

std::vector<std::string> sse_data(const std::string& body) {
  std::vector<std::string> out;
  std::size_t pos = 0;
  while (pos < body.size()) {
    std::size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) end = body.size();
    std::string event = body.substr(pos, end - pos);
    if (event.rfind("data: ", 0) == 0) out.push_back(event.substr(6));
    pos = end + 2;
  }
  return out;
}

std::vector<SseEvent> sse_events(const std::string& body) {
  std::vector<SseEvent> out;
  std::size_t pos = 0;
  while (pos < body.size()) {
    std::size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) end = body.size();
    SseEvent ev;
    for (std::size_t line = pos; line < end;) {
      std::size_t eol = body.find('\n', line);
      if (eol == std::string::npos || eol > end) eol = end;
      const std::string_view l(body.data() + line, eol - line);
      if (l.starts_with("event: ")) ev.event = std::string(l.substr(7));
      else if (l.starts_with("data: ")) ev.data = std::string(l.substr(6));
      line = eol + 1;
    }
    out.push_back(std::move(ev));
    pos = end + 2;
  }
  return out;
}

std::uint64_t Msg::bits() const {
  if (auto* i = std::get_if<std::int64_t>(&v)) return static_cast<std::uint64_t>(*i);
  return std::get<std::uint64_t>(v);
}

const Msg* Msg::get(const std::string& key) const {
  for (const auto& [k, val] : map()) {
    if (auto* s = std::get_if<std::string>(&k.v); s && *s == key) return &val;
  }
  return nullptr;
}

namespace {

struct Reader {
  const unsigned char* p;
  const unsigned char* end;
  bool need(std::size_t n) const { return static_cast<std::size_t>(end - p) >= n; }
  std::uint64_t be(int n) {
    std::uint64_t v = 0;
    for (int i = 0; i < n; ++i) v = (v << 8) | *p++;
    return v;
  }
  bool value(Msg& out, int depth) {
    if (depth > 16 || !need(1)) return false;
    const unsigned char t = *p++;
    auto sized = [&](int n, std::uint64_t& len) {
      if (!need(static_cast<std::size_t>(n))) return false;
      len = be(n);
      return true;
    };
    auto str = [&](std::uint64_t len) {
      if (!need(len)) return false;
      out.v = std::string(reinterpret_cast<const char*>(p), len);
      p += len;
      return true;
    };
    auto arr = [&](std::uint64_t n) {
      Msg::Array a;
      for (std::uint64_t i = 0; i < n; ++i) {
        Msg m;
        if (!value(m, depth + 1)) return false;
        a.push_back(std::move(m));
      }
      out.v = std::move(a);
      return true;
    };
    auto map = [&](std::uint64_t n) {
      Msg::Map m;
      for (std::uint64_t i = 0; i < n; ++i) {
        Msg k, val;
        if (!value(k, depth + 1) || !value(val, depth + 1)) return false;
        m.emplace_back(std::move(k), std::move(val));
      }
      out.v = std::move(m);
      return true;
    };
    std::uint64_t n = 0;
    if (t <= 0x7f) { out.v = std::uint64_t{t}; return true; }
    if (t >= 0xe0) { out.v = static_cast<std::int64_t>(static_cast<std::int8_t>(t)); return true; }
    if ((t & 0xe0) == 0xa0) return str(t & 0x1f);
    if ((t & 0xf0) == 0x90) return arr(t & 0x0f);
    if ((t & 0xf0) == 0x80) return map(t & 0x0f);
    switch (t) {
      case 0xc0: out.v = std::monostate{}; return true;
      case 0xc2: out.v = false; return true;
      case 0xc3: out.v = true; return true;
      case 0xcc: if (!sized(1, n)) return false; out.v = n; return true;
      case 0xcd: if (!sized(2, n)) return false; out.v = n; return true;
      case 0xce: if (!sized(4, n)) return false; out.v = n; return true;
      case 0xcf: if (!sized(8, n)) return false; out.v = n; return true;
      case 0xd0: if (!sized(1, n)) return false; out.v = static_cast<std::int64_t>(static_cast<std::int8_t>(n)); return true;
      case 0xd1: if (!sized(2, n)) return false; out.v = static_cast<std::int64_t>(static_cast<std::int16_t>(n)); return true;
      case 0xd2: if (!sized(4, n)) return false; out.v = static_cast<std::int64_t>(static_cast<std::int32_t>(n)); return true;
      case 0xd3: if (!sized(8, n)) return false; out.v = static_cast<std::int64_t>(n); return true;
      case 0xcb: {
        if (!sized(8, n)) return false;
        double d;
        std::memcpy(&d, &n, 8);
        out.v = d;
        return true;
      }
      case 0xd9: return sized(1, n) && str(n);
      case 0xda: return sized(2, n) && str(n);
      case 0xdb: return sized(4, n) && str(n);
      case 0xdc: return sized(2, n) && arr(n);
      case 0xdd: return sized(4, n) && arr(n);
      case 0xde: return sized(2, n) && map(n);
      case 0xdf: return sized(4, n) && map(n);
      default: return false;
    }
  }
};

}  // namespace

bool msgpack_decode(const std::string& bytes, Msg& out) {
  Reader r{reinterpret_cast<const unsigned char*>(bytes.data()),
           reinterpret_cast<const unsigned char*>(bytes.data()) + bytes.size()};
  return r.value(out, 0) && r.p == r.end;
}

}  // namespace kvroute::sim::testing
