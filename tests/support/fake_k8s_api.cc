#include "tests/support/fake_k8s_api.h"

#include <sstream>

#include <boost/asio/read_until.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/streambuf.hpp>
#include <boost/asio/write.hpp>
#include <boost/json.hpp>

namespace kvroute::test {

namespace asio = boost::asio;
namespace json = boost::json;
using asio::ip::tcp;

json::object k8s_slice(const std::string& name, const std::vector<K8sEndpoint>& eps, int http_port) {
  json::array endpoints;
  for (const auto& e : eps) {
    endpoints.push_back(json::object{{"addresses", json::array{json::string(e.address)}},
                                     {"conditions", json::object{{"ready", e.ready}, {"serving", !e.terminating || e.ready},
                                                                 {"terminating", e.terminating}}},
                                     {"targetRef", json::object{{"kind", "Pod"}, {"name", "vllm-" + e.address}}}});
  }
  return json::object{
      {"kind", "EndpointSlice"},
      {"apiVersion", "discovery.k8s.io/v1"},
      {"metadata", json::object{{"name", name}, {"namespace", "llm"},
                                {"labels", json::object{{"kubernetes.io/service-name", "vllm"}}}}},
      {"addressType", "IPv4"},
      {"endpoints", std::move(endpoints)},
      {"ports", json::array{json::object{{"name", "metrics"}, {"port", 9400}, {"protocol", "TCP"}},
                            json::object{{"name", "http"}, {"port", http_port}, {"protocol", "TCP"}}}}};
}

FakeK8sApi::FakeK8sApi(const std::string& cert_file, const std::string& key_file)
    : acceptor_(io_, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)) {
  if (!cert_file.empty()) {
    tls_ = std::make_unique<asio::ssl::context>(asio::ssl::context::tls_server);
    tls_->use_certificate_chain_file(cert_file);
    tls_->use_private_key_file(key_file, asio::ssl::context::pem);
  }
  thread_ = std::thread([this] { accept_loop(); });
}

FakeK8sApi::~FakeK8sApi() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  // A blocking accept() does not return when its socket is closed by another thread: wake it with a connection.
  boost::system::error_code ec;
  tcp::socket wake(io_);
  wake.connect(acceptor_.local_endpoint(), ec);
  thread_.join();
  acceptor_.close(ec);
  for (auto& t : handlers_) t.join();
}

std::string FakeK8sApi::url() const {
  return (tls_ ? "https://127.0.0.1:" : "http://127.0.0.1:") + std::to_string(acceptor_.local_endpoint().port());
}

std::string FakeK8sApi::authorization() const {
  std::lock_guard lock(mu_);
  return authorization_;
}

std::string FakeK8sApi::last_watch_version() const {
  std::lock_guard lock(mu_);
  return last_watch_rv_;
}

void FakeK8sApi::put(json::object s, bool deliver) { change(std::move(s), false, deliver); }
void FakeK8sApi::remove(json::object s) { change(std::move(s), true, true); }

void FakeK8sApi::bookmark() {
  std::lock_guard lock(mu_);
  ++rv_;
  queue_.push_back(event("BOOKMARK", json::object{{"kind", "EndpointSlice"},
                                                  {"metadata", json::object{{"resourceVersion", std::to_string(rv_)}}}}));
  cv_.notify_all();
}

void FakeK8sApi::compact() {
  std::lock_guard lock(mu_);
  compacted_ = rv_;
}

std::string FakeK8sApi::event(const std::string& type, json::object object) {
  return json::serialize(json::object{{"type", type}, {"object", std::move(object)}}) + "\n";
}

void FakeK8sApi::change(json::object s, bool deleted, bool deliver) {
  std::lock_guard lock(mu_);
  ++rv_;
  s["metadata"].as_object()["resourceVersion"] = std::to_string(rv_);
  const std::string name(s["metadata"].as_object()["name"].as_string());
  const bool known = slices_.count(name) > 0;
  if (deleted) {
    slices_.erase(name);
  } else {
    slices_[name] = s;
  }
  if (deliver) queue_.push_back(event(deleted ? "DELETED" : known ? "MODIFIED" : "ADDED", std::move(s)));
  cv_.notify_all();
}

void FakeK8sApi::command(const std::string& c) {
  std::lock_guard lock(mu_);
  queue_.push_back(c);
  cv_.notify_all();
}

void FakeK8sApi::accept_loop() {
  for (;;) {
    tcp::socket socket(io_);
    boost::system::error_code ec;
    acceptor_.accept(socket, ec);
    if (ec) return;
    std::lock_guard lock(mu_);
    if (stopping_) return;
    handlers_.emplace_back([this, s = std::move(socket)]() mutable { serve(std::move(s)); });
  }
}

void FakeK8sApi::serve(tcp::socket socket) {
  boost::system::error_code ec;
  const auto exchange = [&](auto& stream) {
    asio::streambuf buf;
    asio::read_until(stream, buf, "\r\n\r\n", ec);
    if (ec) return;
    handle(std::string(asio::buffers_begin(buf.data()), asio::buffers_end(buf.data())), [&](const std::string& bytes) {
      asio::write(stream, asio::buffer(bytes), ec);
      return !ec;
    });
  };
  if (!tls_) return exchange(socket);
  asio::ssl::stream<tcp::socket&> tls(socket, *tls_);
  tls.handshake(asio::ssl::stream_base::server, ec);
  if (ec) {
    ++tls_refused_;
    return;
  }
  exchange(tls);
}

void FakeK8sApi::handle(const std::string& head, const Send& send) {
  const std::string target = head.substr(4, head.find(' ', 4) - 4);
  {
    std::lock_guard lock(mu_);
    const auto a = head.find("Authorization: ");
    authorization_ = a == std::string::npos ? "" : head.substr(a + 15, head.find("\r\n", a) - a - 15);
  }
  const std::string path = "/apis/discovery.k8s.io/v1/namespaces/llm/endpointslices?labelSelector=kubernetes.io%2Fservice-name%3Dvllm";
  if (!target.starts_with(path)) {
    send("HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n");
    return;
  }
  if (target.find("watch=1") == std::string::npos) return list(send);
  watch(send, target.substr(target.find("resourceVersion=") + 16));
}

void FakeK8sApi::list(const Send& send) {
  ++lists_;
  json::array items;
  std::string rv;
  {
    std::lock_guard lock(mu_);
    for (const auto& [name, s] : slices_) items.push_back(s);
    rv = std::to_string(rv_);
    queue_.clear();  // what a new watch (from this version) must not see again
  }
  const std::string body = json::serialize(json::object{{"kind", "EndpointSliceList"},
                                                        {"apiVersion", "discovery.k8s.io/v1"},
                                                        {"metadata", json::object{{"resourceVersion", rv}}},
                                                        {"items", std::move(items)}});
  send("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
       "\r\n\r\n" + body);
}

void FakeK8sApi::watch(const Send& send, const std::string& rv) {
  ++watches_;
  const auto chunk = [&](const std::string& data) {
    std::ostringstream hex;
    hex << std::hex << data.size();
    return send(hex.str() + "\r\n" + data + "\r\n");
  };
  bool ok = send("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n");
  std::unique_lock lock(mu_);
  last_watch_rv_ = rv;
  if (std::stoll(rv) < compacted_) {
    const std::string gone = event("ERROR", json::object{{"kind", "Status"}, {"apiVersion", "v1"}, {"status", "Failure"},
                                                         {"message", "too old resource version: " + rv},
                                                         {"reason", "Expired"}, {"code", 410}});
    lock.unlock();
    if (chunk(gone)) send("0\r\n\r\n");
    return;
  }
  while (ok) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (stopping_) break;
    const std::string next = queue_.front();
    queue_.pop_front();
    lock.unlock();
    if (next == "break") return;  // the socket closes without the terminating chunk
    if (next == "end") {
      send("0\r\n\r\n");
      return;
    }
    ok = chunk(next);
    lock.lock();
  }
}

}  // namespace kvroute::test
