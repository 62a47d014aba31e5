// Client API keys, TLS and the header-read timeout end to end (issue 24): the real kvroute in front of a real
// kvroute-sim worker, or of a raw worker that records every request it receives, driven over real sockets, by
// curl and by the official openai npm client over TLS.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <thread>

#include <boost/json.hpp>
#include <gtest/gtest.h>

#include "tests/support/harness.h"

namespace kvroute::test {
namespace {

namespace json = boost::json;
using namespace std::chrono_literals;

std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

// "KEY TENANT" lines: two tenants, and a key the worker would accept were it ever forwarded.
std::string keys_file() { return write_file("kvroute-access-keys", "# e2e keys\nkey-a tenant-a\nkey-b tenant-b\n"); }

std::map<std::string, std::string> bearer(const std::string& key) { return {{"Authorization", "Bearer " + key}}; }

// A self-signed certificate for 127.0.0.1 and localhost, made at run time with the openssl CLI.
std::pair<std::string, std::string> make_cert() {
  const std::string dir = ::testing::TempDir();
  const std::string cert = dir + "/kvroute-access-cert.pem", key = dir + "/kvroute-access-key.pem";
  const std::string cmd = "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 -subj "
                          "/CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout " + key +
                          " -out " + cert + " >/dev/null 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return {cert, key};
}

// curl's status code and body; `args` are curl arguments after the URL.
std::pair<int, std::string> curl(const std::string& url, const std::string& args) {
  const std::string out = ::testing::TempDir() + "/kvroute-access-curl.out";
  const std::string cmd = "curl -sS --max-time 10 -o " + out + " -w '%{http_code}' " + args + " '" + url + "' 2>&1";
  std::string printed;
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    char buf[512];
    while (std::fgets(buf, sizeof buf, p)) printed += buf;
    ::pclose(p);
  }
  std::ifstream in(out);
  std::string body((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::remove(out.c_str());
  int status = 0;
  try {
    status = std::stoi(printed.substr(printed.size() >= 3 ? printed.size() - 3 : 0));
  } catch (...) {
  }
  return {status, body + printed};
}

// A worker on a raw socket: records every request head it receives and answers each with a small completion.
class RecordingWorker {
 public:
  RecordingWorker() : port_(free_port()) {
    listener_ = listen_loopback(port_);
    EXPECT_GE(listener_, 0);
    thread_ = std::thread([this] { serve(); });
  }
  ~RecordingWorker() {
    ::shutdown(listener_, SHUT_RDWR);
    ::close(listener_);
    thread_.join();
  }
  int port() const { return port_; }
  std::string seen() const {
    std::lock_guard lock(mu_);
    return seen_;
  }

 private:
  void serve() {
    static const std::string body = R"({"id":"c","object":"text_completion","choices":[{"index":0,"text":"ok"}],)"
                                    R"("usage":{"prompt_tokens":2,"completion_tokens":1,"total_tokens":3}})";
    static const std::string answer = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                                      "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    for (;;) {
      const int c = ::accept(listener_, nullptr, nullptr);
      if (c < 0) break;
      std::string request;
      char buf[8192];
      while (request.find("\r\n\r\n") == std::string::npos) {
        const ssize_t n = ::recv(c, buf, sizeof buf, 0);
        if (n <= 0) break;
        request.append(buf, static_cast<std::size_t>(n));
      }
      {
        std::lock_guard lock(mu_);
        seen_ += request.substr(0, request.find("\r\n\r\n") + 4);
      }
      ::send(c, answer.data(), answer.size(), MSG_NOSIGNAL);
      ::close(c);
    }
  }

  int port_;
  int listener_ = -1;
  mutable std::mutex mu_;
  std::string seen_;  // guarded by mu_
  std::thread thread_;
};

Process start_router(int api, int admin, std::vector<std::string> extra, const std::string& log) {
  std::vector<std::string> argv = {bin("kvroute"), "--listen", "127.0.0.1:" + std::to_string(api), "--admin-listen",
                                   "127.0.0.1:" + std::to_string(admin)};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return Process::start(argv, ::testing::TempDir() + "/" + log);
}

std::string prompt_body(int tokens) {
  json::array prompt;
  for (int t = 0; t < tokens; ++t) prompt.push_back(1000 + (t * 7919) % 30000);
  return json::serialize(json::object{{"model", "qwen3-8b"}, {"prompt", prompt}, {"max_tokens", 1}});
}

std::uint64_t cached_tokens(const HttpResponse& r) {
  return json::parse(r.body).at("usage").at("prompt_tokens_details").at("cached_tokens").to_number<std::uint64_t>();
}

// A worker started with its own API key (as vllm serve --api-key): kvroute takes the clients' keys, sends the
// worker its own key instead, and keeps tenants' caches apart by the key's tenant, whatever header is sent.
TEST(AccessE2E, ApiKeysAreRequiredAndNameTheTenant) {
  const int sim = free_port();
  Process worker = Process::start({bin("kvroute-sim"), "--port", std::to_string(sim), "--speed", "20", "--api-key",
                                   "worker-secret"},
                                  ::testing::TempDir() + "/kvroute-access-sim.log");
  ASSERT_TRUE(wait_http(sim, "/health", 10s));
  const int api = free_port(), admin = free_port();
  Process router = start_router(api, admin,
                                {"--worker", "http://127.0.0.1:" + std::to_string(sim), "--api-keys-file", keys_file(),
                                 "--worker-api-key", "worker-secret", "--tenant-salt-secret", "e2e"},
                                "kvroute-access-keys.log");
  ASSERT_TRUE(wait_http(api, "/health", 10s));  // probes need no key
  EXPECT_EQ(http(api, "GET", "/ready").status, 200);

  const std::string body = prompt_body(512);
  const auto none = http(api, "POST", "/v1/completions", body);
  EXPECT_EQ(none.status, 401);
  EXPECT_EQ(none.header("www-authenticate"), "Bearer");
  EXPECT_EQ(json::parse(none.body).at("error").at("code").as_string(), "invalid_api_key") << none.body;
  EXPECT_EQ(http(api, "POST", "/v1/completions", body, bearer("key-c")).status, 401);
  EXPECT_EQ(http(api, "POST", "/v1/completions", body, {{"Authorization", "Basic a2V5LWE="}}).status, 401);
  EXPECT_EQ(http(api, "GET", "/v1/models").status, 401);
  // The worker's own key is no client key either.
  EXPECT_EQ(http(api, "POST", "/v1/completions", body, bearer("worker-secret")).status, 401);

  // A valid key: served, by a worker that would refuse the client's key (so kvroute sent the worker's).
  const auto a1 = http(api, "POST", "/v1/completions", body, bearer("key-a"));
  ASSERT_EQ(a1.status, 200) << a1.body;
  EXPECT_EQ(cached_tokens(a1), 0u);
  EXPECT_GE(cached_tokens(http(api, "POST", "/v1/completions", body, bearer("key-a"))), 496u);
  EXPECT_EQ(http(api, "GET", "/v1/models", "", bearer("key-b")).status, 200);

  // Tenant b, the same prompt, even naming tenant a in the tenant header: nothing of a's cache.
  auto spoof = bearer("key-b");
  spoof["x-tenant-id"] = "tenant-a";
  const auto b1 = http(api, "POST", "/v1/completions", body, spoof);
  ASSERT_EQ(b1.status, 200) << b1.body;
  EXPECT_EQ(cached_tokens(b1), 0u) << "tenant b saw tenant a's cached prefix";
  EXPECT_GE(cached_tokens(http(api, "POST", "/v1/completions", body, bearer("key-b"))), 496u);
}

// What reaches the worker, read from the worker's side: never the client's key, the key's tenant in the tenant
// header, no field the client's Connection header names, and no dot segment.
TEST(AccessE2E, TheWorkerNeverSeesTheClientsKey) {
  RecordingWorker worker;
  const int api = free_port(), admin = free_port();
  Process router = start_router(api, admin,
                                {"--worker", "http://127.0.0.1:" + std::to_string(worker.port()), "--api-keys-file",
                                 keys_file(), "--metrics-interval", "0"},
                                "kvroute-access-recording.log");
  ASSERT_TRUE(wait_http(api, "/health", 10s));
  auto headers = bearer("key-a");
  headers["x-tenant-id"] = "tenant-b";
  headers["Connection"] = "keep-alive, x-hop-secret";
  headers["x-hop-secret"] = "hop-value";
  const auto r = http(api, "POST", "/v1/completions", R"({"model":"m","prompt":"hello","max_tokens":1})", headers, 5s);
  ASSERT_EQ(r.status, 200) << r.body << r.error;
  // Dot segments are resolved before routing: the admin API is not on this port, and nothing reaches the
  // worker as sent.
  const std::string dots = "GET /v1/../admin/workers HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer key-a\r\n\r\n";
  const std::string answer = raw_exchange(api, dots, 3s);
  EXPECT_EQ(answer.rfind("HTTP/1.1 404", 0), 0u) << answer;
  EXPECT_EQ(raw_exchange(api, "GET /v1/%2e%2e/admin/workers HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer key-a\r\n\r\n",
                         3s).rfind("HTTP/1.1 404", 0), 0u);
  EXPECT_EQ(raw_exchange(api, "GET /../admin/workers HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer key-a\r\n\r\n", 3s)
                .rfind("HTTP/1.1 400", 0), 0u);
  // A passed-through route: the key is stripped there too.
  EXPECT_EQ(http(api, "POST", "/v1/embeddings", R"({"model":"m","input":"x"})", bearer("key-b"), 5s).status, 200);

  const std::string seen = worker.seen();
  ASSERT_NE(seen.find("POST /v1/completions"), std::string::npos) << seen;
  ASSERT_NE(seen.find("POST /v1/embeddings"), std::string::npos) << seen;
  EXPECT_EQ(seen.find("key-a"), std::string::npos) << "the client's key reached the worker:\n" << seen;
  EXPECT_EQ(seen.find("key-b"), std::string::npos) << seen;
  EXPECT_EQ(seen.find("uthorization"), std::string::npos) << seen;
  EXPECT_NE(seen.find("x-tenant-id: tenant-a"), std::string::npos) << seen;
  EXPECT_EQ(seen.find("tenant-b\r\n\r\nPOST /v1/completions"), std::string::npos) << seen;
  EXPECT_EQ(seen.find("x-hop-secret"), std::string::npos) << "a field named in Connection was forwarded:\n" << seen;
  EXPECT_EQ(seen.find("hop-value"), std::string::npos) << seen;
  EXPECT_EQ(seen.find("admin"), std::string::npos) << seen;
  EXPECT_EQ(seen.find(".."), std::string::npos) << seen;
}

// TLS on both listeners, one certificate for both: curl and the openai npm client (Node's TLS) trust it
// through the test's CA file; a plain HTTP request on the TLS port gets no HTTP answer.
TEST(AccessE2E, TlsOnTheApiAndAdminListeners) {
  const auto [cert, key] = make_cert();
  const int sim = free_port();
  Process worker = Process::start({bin("kvroute-sim"), "--port", std::to_string(sim), "--speed", "20"},
                                  ::testing::TempDir() + "/kvroute-access-tls-sim.log");
  ASSERT_TRUE(wait_http(sim, "/health", 10s));
  const int api = free_port(), admin = free_port();
  Process router = start_router(api, admin,
                                {"--worker", "http://127.0.0.1:" + std::to_string(sim), "--tls-cert", cert, "--tls-key",
                                 key, "--api-keys-file", keys_file()},
                                "kvroute-access-tls.log");
  const std::string ca = "--cacert " + cert;
  const std::string base = "https://127.0.0.1:" + std::to_string(api);
  for (int i = 0; i < 100 && curl(base + "/health", ca).first != 200; ++i) std::this_thread::sleep_for(100ms);
  ASSERT_EQ(curl(base + "/health", ca).first, 200);

  const auto chat = curl(base + "/v1/chat/completions",
                         ca + " -H 'Authorization: Bearer key-a' -H 'Content-Type: application/json' -d "
                              "'{\"model\":\"qwen3-8b\",\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}'");
  EXPECT_EQ(chat.first, 200) << chat.second;
  EXPECT_NE(chat.second.find("\"choices\""), std::string::npos) << chat.second;
  const auto streamed = curl(base + "/v1/completions",
                             ca + " -N -H 'Authorization: Bearer key-a' -H 'Content-Type: application/json' -d "
                                  "'{\"model\":\"qwen3-8b\",\"max_tokens\":6,\"stream\":true,\"prompt\":\"hi\"}'");
  EXPECT_EQ(streamed.first, 200) << streamed.second;
  EXPECT_NE(streamed.second.find("data: [DONE]"), std::string::npos) << streamed.second;
  EXPECT_EQ(curl(base + "/v1/models", ca).first, 401);
  // Without the CA, the certificate is not trusted; plain HTTP on the TLS port gets no HTTP answer.
  EXPECT_EQ(curl(base + "/health", "").first, 0);
  EXPECT_EQ(raw_exchange(api, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n", 2s).find("HTTP/1.1"), std::string::npos);

  const std::string admin_base = "https://127.0.0.1:" + std::to_string(admin);
  const auto workers = curl(admin_base + "/admin/workers", ca);
  EXPECT_EQ(workers.first, 200) << workers.second;
  EXPECT_NE(workers.second.find("127.0.0.1:" + std::to_string(sim)), std::string::npos) << workers.second;
  EXPECT_EQ(curl(admin_base + "/metrics", ca).first, 200);

  // The official openai npm client over TLS, with an API key, streaming and not.
  const std::string dir = source_dir() + "/tests/e2e";
  if (std::system(("test -d " + dir + "/node_modules/openai").c_str()) != 0) {
    GTEST_SKIP() << "tests/e2e/node_modules is missing (scripts/setup.sh installs it)";
  }
  const std::string log = ::testing::TempDir() + "/kvroute-access-openai-tls.log";
  const std::string cmd = "NODE_EXTRA_CA_CERTS=" + cert + " node " + dir + "/openai_tls.mjs " + base + "/v1 key-a > " +
                          log + " 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << "see " << log;
}

// A partial request head gets 408 and a close after --header-read-timeout; a connection that sends nothing,
// or idles after a request, is closed silently after --client-idle-timeout.
TEST(AccessE2E, APartialHeadGets408AndAnIdleConnectionIsJustClosed) {
  const int sim = free_port();
  Process worker = Process::start({bin("kvroute-sim"), "--port", std::to_string(sim), "--speed", "20"},
                                  ::testing::TempDir() + "/kvroute-access-408-sim.log");
  ASSERT_TRUE(wait_http(sim, "/health", 10s));
  const int api = free_port(), admin = free_port();
  Process router = start_router(api, admin,
                                {"--worker", "http://127.0.0.1:" + std::to_string(sim), "--header-read-timeout", "1",
                                 "--client-idle-timeout", "3"},
                                "kvroute-access-408.log");
  ASSERT_TRUE(wait_http(api, "/health", 10s));

  auto t0 = std::chrono::steady_clock::now();
  const std::string partial = raw_exchange(api, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Ty", 8s);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(partial.rfind("HTTP/1.1 408", 0), 0u) << partial;
  EXPECT_NE(partial.find("Connection: close"), std::string::npos) << partial;
  EXPECT_NE(partial.find("request_timeout"), std::string::npos) << partial;
  EXPECT_GE(took, 0.9);
  EXPECT_LT(took, 2.5) << "the header timeout, not the idle timeout, ended it";

  t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(raw_exchange(api, "", 8s), "");  // nothing sent, nothing answered: closed at the idle timeout
  const double idle = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(idle, 2.9);
  EXPECT_LT(idle, 5.0);

  // A whole request, then idle: one answer, then a silent close (no 408).
  const std::string one = raw_exchange(api, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n", 8s);
  EXPECT_EQ(one.rfind("HTTP/1.1 200", 0), 0u) << one;
  EXPECT_EQ(one.find("HTTP/1.1 408"), std::string::npos) << one;  // (a request id may hold the digits 408)
  EXPECT_EQ(http(api, "GET", "/health").status, 200);
  const std::string metrics = http(admin, "GET", "/metrics").body;
  EXPECT_EQ(metric_sum(metrics, "kvroute_errors_total{kind=\"header_timeout\"}"), 1.0);
}

}  // namespace
}  // namespace kvroute::test
