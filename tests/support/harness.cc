#include "tests/support/harness.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <cerrno>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <thread>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

extern char** environ;

namespace kvroute::test {

namespace beast = boost::beast;
namespace http_ns = beast::http;
namespace asio = boost::asio;
using tcp = asio::ip::tcp;

std::string bin(const std::string& name) {
  const char* dir = std::getenv("KVROUTE_BIN_DIR");
  return std::string(dir ? dir : "../bin") + "/" + name;
}

std::string source_dir() {
  const char* dir = std::getenv("KVROUTE_SOURCE_DIR");
  return dir ? dir : "..";
}

Process Process::start(const std::vector<std::string>& argv, const std::string& log_file) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  const std::string log = log_file.empty() ? "/dev/null" : log_file;
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  Process p;
  if (posix_spawn(&p.pid_, args[0], &fa, nullptr, args.data(), environ) != 0) p.pid_ = -1;
  posix_spawn_file_actions_destroy(&fa);
  return p;
}

Process& Process::operator=(Process&& o) noexcept {
  if (this != &o) {
    stop();
    pid_ = o.pid_;
    o.pid_ = -1;
  }
  return *this;
}

bool Process::running() const {
  if (pid_ <= 0) return false;
  int status = 0;
  return waitpid(pid_, &status, WNOHANG) == 0;
}

void Process::stop(int signal) {
  if (pid_ <= 0) return;
  ::kill(pid_, signal);
  for (int i = 0; i < 300; ++i) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) != 0) {
      pid_ = -1;
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill_now();
}

void Process::kill_now() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
}

namespace {
sockaddr_in loopback(int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return addr;
}
}  // namespace

int listen_loopback(int port, int backlog) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  const sockaddr_in addr = loopback(port);
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd, backlog) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

int connect_loopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  const sockaddr_in addr = loopback(port);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// The lowest port the kernel hands out for outgoing connections; ports at or above it can be taken by any
// client socket between the probe and the server's bind, so tests listen below it.
int ephemeral_low() {
  std::ifstream f("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 32768;
  if (!(f >> low) || low < 12000) low = 32768;
  return low;
}

int free_ports(int n) {
  // Probe upwards from a pid-dependent base so concurrently running test binaries rarely collide, in
  // [10000, ephemeral_low()).
  static const int top = ephemeral_low() - 64;
  static std::atomic<int> next{10000 + static_cast<int>((static_cast<long>(getpid()) * 64) % (top - 10000))};
  while (true) {
    int base = next.fetch_add(n);
    if (base + n >= top) next = base = 10000;
    bool ok = true;
    for (int p = base; p < base + n && ok; ++p) {
      asio::io_context io;
      tcp::acceptor a(io);
      boost::system::error_code ec;
      a.open(tcp::v4(), ec);
      a.bind(tcp::endpoint(asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(p)), ec);
      if (ec) ok = false;
    }
    if (ok) return base;
  }
}

int free_port() { return free_ports(1); }

bool wait_http(int port, const std::string& path, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    auto r = http(port, "GET", path, "", {}, std::chrono::milliseconds(500));
    if (r.status == 200) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

std::string HttpResponse::header(const std::string& name) const {
  auto it = headers.find(name);
  return it == headers.end() ? "" : it->second;
}

namespace {
HttpResponse exchange(int port, const std::string& method, const std::string& target, const std::string& body,
                      const std::map<std::string, std::string>& headers, std::chrono::milliseconds timeout,
                      const std::function<void(const std::string&, std::chrono::steady_clock::time_point)>* on_piece) {
  HttpResponse out;
  asio::io_context io;
  beast::tcp_stream stream(io);
  stream.expires_after(timeout);
  beast::error_code ec;
  stream.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)), ec);
  if (ec) {
    out.error = "connect: " + ec.message();
    return out;
  }
  // Synchronous reads ignore tcp_stream expiries: bound them with SO_RCVTIMEO.
  timeval tv{static_cast<time_t>(timeout.count() / 1000), static_cast<suseconds_t>((timeout.count() % 1000) * 1000)};
  setsockopt(stream.socket().native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  http_ns::request<http_ns::string_body> req{http_ns::string_to_verb(method), target, 11};
  req.set(http_ns::field::host, "127.0.0.1");
  if (!body.empty()) req.set(http_ns::field::content_type, "application/json");
  for (const auto& [k, v] : headers) req.set(k, v);
  req.body() = body;
  req.prepare_payload();
  http_ns::write(stream, req, ec);
  if (ec) {
    out.error = "write: " + ec.message();
    return out;
  }
  beast::flat_buffer buf;
  http_ns::response_parser<http_ns::buffer_body> p;
  p.body_limit(boost::none);
  http_ns::read_header(stream, buf, p, ec);
  if (ec) {
    out.error = "read header: " + ec.message();
    return out;
  }
  char chunk[8192];
  while (!p.is_done()) {
    p.get().body().data = chunk;
    p.get().body().size = sizeof chunk;
    http_ns::read_some(stream, buf, p, ec);
    if (ec == http_ns::error::need_buffer) ec = {};
    if (ec) {
      out.error = "read body: " + ec.message();
      break;
    }
    const std::size_t n = sizeof chunk - p.get().body().size;
    if (n == 0) continue;
    std::string piece(chunk, n);
    if (on_piece) (*on_piece)(piece, std::chrono::steady_clock::now());
    out.body += piece;
  }
  out.status = p.get().result_int();
  for (const auto& f : p.get()) {
    std::string name(f.name_string());
    for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    out.headers[name] = std::string(f.value());
  }
  stream.socket().shutdown(tcp::socket::shutdown_both, ec);
  return out;
}
}  // namespace

HttpResponse http(int port, const std::string& method, const std::string& target, const std::string& body,
                  const std::map<std::string, std::string>& headers, std::chrono::milliseconds timeout) {
  return exchange(port, method, target, body, headers, timeout, nullptr);
}

HttpResponse http_stream(int port, const std::string& method, const std::string& target, const std::string& body,
                         const std::map<std::string, std::string>& headers,
                         const std::function<void(const std::string&, std::chrono::steady_clock::time_point)>& on_piece) {
  return exchange(port, method, target, body, headers, std::chrono::seconds(60), &on_piece);
}

std::string raw_exchange(int port, const std::string& bytes, std::chrono::milliseconds timeout) {
  // Synchronous Beast operations ignore tcp_stream expiries, so the deadline is enforced with SO_RCVTIMEO.
  asio::io_context io;
  tcp::socket sock(io);
  beast::error_code ec;
  sock.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)), ec);
  if (ec) return "";
  timeval tv{0, 50 * 1000};
  setsockopt(sock.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  asio::write(sock, asio::buffer(bytes), ec);
  std::string out;
  char buf[4096];
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    const ssize_t n = ::recv(sock.native_handle(), buf, sizeof buf, 0);
    if (n > 0) {
      out.append(buf, static_cast<std::size_t>(n));
    } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      break;
    }
  }
  sock.close(ec);
  return out;
}

double metric_sum(const std::string& text, const std::string& name) {
  double sum = 0;
  for (std::size_t pos = text.find("\n" + name); pos != std::string::npos; pos = text.find("\n" + name, pos + 1)) {
    const char next = pos + 1 + name.size() < text.size() ? text[pos + 1 + name.size()] : '\n';
    if (next != ' ' && next != '{') continue;  // another metric whose name starts the same
    const auto space = text.find(' ', next == '{' ? text.find('}', pos) : pos + 1);
    sum += std::stod(text.substr(space + 1, text.find('\n', space) - space - 1));
  }
  return sum;
}

}  // namespace kvroute::test
