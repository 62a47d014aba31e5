// FakeK8sApi: a small Kubernetes API server on a real loopback socket that serves the EndpointSlices of one
// Service (namespace llm, service vllm) as the real one does: LIST answers an EndpointSliceList with its
// resourceVersion; WATCH from a resourceVersion streams {"type","object"} lines in HTTP chunks (ADDED,
// MODIFIED, DELETED, BOOKMARK), answers ERROR with code 410 for a version compacted away, and ends with a
// terminating chunk when told its time is up. Each connection carries one request. Given a certificate and key,
// it speaks https, as the real one does.
//
//   FakeK8sApi api;
//   api.put(k8s_slice("vllm-abc", {{"10.0.0.1"}, {"10.0.0.2", false}}));   // one ready, one not
//   ... kvroute --discover-k8s llm/vllm:http --k8s-api-url api.url() ...
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/json/object.hpp>

namespace kvroute::test {

struct K8sEndpoint {
  std::string address;
  bool ready = true;
  bool terminating = false;
};

// An EndpointSlice as the EndpointSlice controller writes it: ports "metrics" (9400) and "http" (`http_port`),
// conditions on every endpoint.
boost::json::object k8s_slice(const std::string& name, const std::vector<K8sEndpoint>& endpoints, int http_port = 8000);

class FakeK8sApi {
 public:
  // With a certificate and its key (PEM files), https; else http.
  explicit FakeK8sApi(const std::string& cert_file = "", const std::string& key_file = "");
  ~FakeK8sApi();
  FakeK8sApi(const FakeK8sApi&) = delete;
  FakeK8sApi& operator=(const FakeK8sApi&) = delete;
  std::string url() const;

  // A change, sent to the open watch (when `deliver`) and seen by every later list.
  void put(boost::json::object slice, bool deliver = true);
  void remove(boost::json::object slice);
  void bookmark();
  // Every version up to now is compacted: a watch from an older one is answered with ERROR 410.
  void compact();
  // The open watch ends as the server ends it when its timeoutSeconds are up, or breaks without a word.
  void end_watch() { command("end"); }
  void break_watch() { command("break"); }

  int lists() const { return lists_.load(); }
  int tls_refused() const { return tls_refused_.load(); }  // TLS handshakes that failed
  int watches() const { return watches_.load(); }
  std::string authorization() const;
  std::string last_watch_version() const;

 private:
  static std::string event(const std::string& type, boost::json::object object);
  void change(boost::json::object slice, bool deleted, bool deliver);
  void command(const std::string& c);
  void accept_loop();
  using Send = std::function<bool(const std::string& bytes)>;  // false: the connection broke
  void serve(boost::asio::ip::tcp::socket socket);
  void handle(const std::string& head, const Send& send);
  void list(const Send& send);
  void watch(const Send& send, const std::string& rv);

  boost::asio::io_context io_;
  boost::asio::ip::tcp::acceptor acceptor_;
  std::unique_ptr<boost::asio::ssl::context> tls_;  // null: http
  std::thread thread_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, boost::json::object> slices_;  // guarded by mu_
  std::deque<std::string> queue_;  // guarded by mu_: events and commands for the open watch
  long long rv_ = 100;             // guarded by mu_
  long long compacted_ = 0;        // guarded by mu_
  std::string authorization_;      // guarded by mu_
  std::string last_watch_rv_;      // guarded by mu_
  bool stopping_ = false;          // guarded by mu_
  std::vector<std::thread> handlers_;  // guarded by mu_
  std::atomic<int> lists_{0}, watches_{0}, tls_refused_{0};
};

}  // namespace kvroute::test
