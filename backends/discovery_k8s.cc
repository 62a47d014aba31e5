#include "backends/discovery_k8s.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>
#include <boost/json.hpp>

#include "backends/discovery.h"

namespace kvroute::backends {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace json = boost::json;

namespace {
constexpr const char* kServiceAccount = "/var/run/secrets/kubernetes.io/serviceaccount/";
const auto kTuple = asio::as_tuple(asio::use_awaitable);

std::optional<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

std::string get_string(const json::object& o, std::string_view key) {
  const auto* v = o.if_contains(key);
  return v && v->is_string() ? std::string(v->get_string()) : std::string();
}

// A condition as the API defines it: absent (or null) means `absent`.
bool condition(const json::object* conditions, std::string_view key, bool absent) {
  if (!conditions) return absent;
  const auto* v = conditions->if_contains(key);
  return v && v->is_bool() ? v->get_bool() : absent;
}

// The Status object of a failed request or an ERROR watch event: its message, else the raw text.
std::string status_message(std::string_view body) {
  boost::system::error_code ec;
  const json::value v = json::parse(body, ec);
  if (!ec && v.is_object()) {
    if (auto m = get_string(v.get_object(), "message"); !m.empty()) return m;
  }
  return std::string(body.substr(0, 200));
}
}  // namespace

Result<K8sApi> in_cluster_api(const K8sApi& overrides) {
  K8sApi api = overrides;
  if (api.url.empty()) {
    const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
    const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
    if (!host || !*host || !port || !*port) {
      return make_error("KUBERNETES_SERVICE_HOST/PORT are not set (not in a pod?): give --k8s-api-url");
    }
    const std::string h = host;
    api.url = "https://" + (h.find(':') != std::string::npos ? "[" + h + "]" : h) + ":" + port;
  }
  if (api.token_file.empty()) api.token_file = std::string(kServiceAccount) + "token";
  if (api.ca_file.empty()) api.ca_file = std::string(kServiceAccount) + "ca.crt";
  if (!api.url.starts_with("https://") && !api.url.starts_with("http://")) {
    return make_error("Kubernetes API URL '" + api.url + "' must start with https:// or http://");
  }
  return api;
}

Result<std::string> in_cluster_namespace() {
  const std::string path = std::string(kServiceAccount) + "namespace";
  if (auto ns = read_file(path); ns && !ns->empty()) return *ns;
  return make_error("cannot read " + path + " (not in a pod?): write NAMESPACE/SERVICE");
}

Result<EndpointSlice> parse_endpoint_slice(const json::value& object, std::string_view port_name) {
  if (!object.is_object()) return make_error("EndpointSlice is not an object");
  const json::object& o = object.get_object();
  EndpointSlice slice;
  if (const auto* meta = o.if_contains("metadata"); meta && meta->is_object()) {
    slice.name = get_string(meta->get_object(), "name");
  }
  if (slice.name.empty()) return make_error("EndpointSlice without metadata.name");
  // Ports: the one named port_name; unnamed, the only one. A null port number means "every port" (a
  // selector-less Service): nothing to dial.
  if (const auto* ports = o.if_contains("ports"); ports && ports->is_array()) {
    const auto& list = ports->get_array();
    for (const auto& p : list) {
      if (!p.is_object()) continue;
      const auto& po = p.get_object();
      if (!port_name.empty() ? get_string(po, "name") != port_name : list.size() != 1) continue;
      if (const auto* n = po.if_contains("port"); n && n->is_int64()) slice.port = std::to_string(n->get_int64());
    }
  }
  if (const auto* eps = o.if_contains("endpoints"); eps && eps->is_array()) {
    for (const auto& e : eps->get_array()) {
      if (!e.is_object()) return make_error("EndpointSlice " + slice.name + ": an endpoint is not an object");
      const auto& eo = e.get_object();
      const auto* addresses = eo.if_contains("addresses");
      // Addresses of one endpoint are fungible (the API's own words): the first is dialed.
      if (!addresses || !addresses->is_array() || addresses->get_array().empty() ||
          !addresses->get_array().front().is_string()) {
        continue;
      }
      const auto* c = eo.if_contains("conditions");
      const json::object* conditions = c && c->is_object() ? &c->get_object() : nullptr;
      SliceEndpoint ep;
      ep.address = std::string(addresses->get_array().front().get_string());
      ep.ready = condition(conditions, "ready", true);
      ep.serving = condition(conditions, "serving", ep.ready);
      ep.terminating = condition(conditions, "terminating", false);
      slice.endpoints.push_back(std::move(ep));
    }
  }
  return slice;
}

// The stream of one request: plain TCP, or TLS over it.
struct K8sDiscovery::Connection {
  explicit Connection(asio::any_io_executor ex) : tcp(std::in_place, ex) {}
  beast::tcp_stream& lowest() { return tls ? beast::get_lowest_layer(*tls) : *tcp; }
  std::optional<beast::tcp_stream> tcp;
  std::unique_ptr<asio::ssl::context> tls_context;
  std::optional<beast::ssl_stream<beast::tcp_stream>> tls;
  beast::flat_buffer buffer;
};

namespace {
// HOST and PORT of an http(s)://HOST[:PORT][/...] URL (IPv6 in brackets).
std::pair<std::string, std::string> host_port(std::string_view url, bool https) {
  url.remove_prefix(https ? 8 : 7);
  url = url.substr(0, url.find('/'));
  std::string port = https ? "443" : "80";
  if (!url.empty() && url.front() == '[') {
    const auto close = url.find(']');
    if (close != std::string_view::npos && close + 1 < url.size() && url[close + 1] == ':') port = url.substr(close + 2);
    return {std::string(url.substr(1, close == std::string_view::npos ? url.npos : close - 1)), port};
  }
  if (const auto colon = url.rfind(':'); colon != std::string_view::npos) {
    return {std::string(url.substr(0, colon)), std::string(url.substr(colon + 1))};
  }
  return {std::string(url), port};
}

// Sends `req` and hands the response's body to on_body piece by piece, whatever its framing (Content-Length,
// or the chunks of a watch stream); every read has `idle` to bring a byte.
template <class Stream>
asio::awaitable<Result<unsigned>> exchange(Stream& s, beast::tcp_stream& lowest, beast::flat_buffer& buffer,
                                           const http::request<http::empty_body>& req, std::chrono::seconds idle,
                                           const std::function<bool(unsigned, std::string_view)>& on_body) {
  lowest.expires_after(idle);
  auto [wec, written] = co_await http::async_write(s, req, kTuple);
  if (wec) co_return make_error("send: " + wec.message());
  http::response_parser<http::buffer_body> p;
  p.body_limit(boost::none);  // on_body bounds what it keeps
  auto [hec, head] = co_await http::async_read_header(s, buffer, p, kTuple);
  if (hec) co_return make_error("read: " + hec.message());
  const unsigned status = p.get().result_int();
  std::array<char, 16384> chunk;
  while (!p.is_done()) {
    p.get().body().data = chunk.data();
    p.get().body().size = chunk.size();
    lowest.expires_after(idle);
    // read_some, not read: it returns with what has arrived, so a watch event is handled when its chunk lands.
    auto [rec, n] = co_await http::async_read_some(s, buffer, p, kTuple);
    if (rec == http::error::need_buffer) rec = {};
    if (rec) co_return make_error("read: " + rec.message());
    const std::size_t got = chunk.size() - p.get().body().size;
    if (got > 0 && !on_body(status, std::string_view(chunk.data(), got))) break;
  }
  co_return status;
}
}  // namespace

K8sDiscovery::K8sDiscovery(asio::any_io_executor ex, WorkerRegistry& registry, Target target, K8sApi api,
                           Report report, Options options)
    : strand_(asio::make_strand(ex)),
      backoff_timer_(strand_),
      registry_(registry),
      target_(std::move(target)),
      api_(std::move(api)),
      report_(std::move(report)),
      options_(options) {
  if (!report_) report_ = [](bool, const std::string&) {};
}

void K8sDiscovery::start() { asio::co_spawn(strand_, run(shared_from_this()), asio::detached); }

void K8sDiscovery::stop() {
  asio::post(strand_, [self = shared_from_this()] {
    self->stopped_ = true;
    self->backoff_timer_.cancel();
    if (self->connection_) self->connection_->lowest().close();
  });
}

asio::awaitable<Result<unsigned>> K8sDiscovery::get(const std::string& target, OnBody on_body) {
  const bool https = api_.url.starts_with("https://");
  const auto [host, port] = host_port(api_.url, https);
  auto conn = std::make_shared<Connection>(co_await asio::this_coro::executor);
  connection_ = conn;
  asio::ip::tcp::resolver resolver(strand_);
  auto [rec, endpoints] = co_await resolver.async_resolve(host, port, kTuple);
  if (rec) co_return make_error("resolve " + host + ": " + rec.message());
  if (stopped_) co_return make_error("stopped");
  conn->tcp->expires_after(options_.connect_timeout);
  auto [cec, connected] = co_await conn->tcp->async_connect(endpoints, kTuple);
  if (cec) co_return make_error("connect to " + api_.url + ": " + cec.message());
  http::request<http::empty_body> req{http::verb::get, target, 11};
  req.set(http::field::host, host);
  req.set(http::field::accept, "application/json");
  req.set(http::field::user_agent, "kvroute");
  if (auto token = read_file(api_.token_file); token && !token->empty()) {
    req.set(http::field::authorization, "Bearer " + *token);
  } else if (https) {
    co_return make_error("cannot read the service account token " + api_.token_file);
  }
  if (!https) co_return co_await exchange(*conn->tcp, *conn->tcp, conn->buffer, req, options_.idle_timeout, on_body);
  // The CA is read for every connection, so a rotated one is picked up.
  conn->tls_context = std::make_unique<asio::ssl::context>(asio::ssl::context::tls_client);
  boost::system::error_code ec;
  conn->tls_context->load_verify_file(api_.ca_file, ec);
  if (ec) co_return make_error("CA file " + api_.ca_file + ": " + ec.message());
  conn->tls_context->set_verify_mode(asio::ssl::verify_peer);
  conn->tls.emplace(std::move(*conn->tcp), *conn->tls_context);
  conn->tcp.reset();
  conn->tls->set_verify_callback(asio::ssl::host_name_verification(host));
  boost::system::error_code not_ip;
  asio::ip::make_address(host, not_ip);
  if (not_ip) SSL_set_tlsext_host_name(conn->tls->native_handle(), host.c_str());  // SNI names hosts, not IPs
  conn->lowest().expires_after(options_.connect_timeout);
  auto [hec] = co_await conn->tls->async_handshake(asio::ssl::stream_base::client, kTuple);
  if (hec) co_return make_error("TLS with " + api_.url + ": " + hec.message());
  co_return co_await exchange(*conn->tls, conn->lowest(), conn->buffer, req, options_.idle_timeout, on_body);
}

std::string K8sDiscovery::path() const {
  return "/apis/discovery.k8s.io/v1/namespaces/" + target_.ns +
         "/endpointslices?labelSelector=kubernetes.io%2Fservice-name%3D" + target_.service;
}

asio::awaitable<void> K8sDiscovery::run(std::shared_ptr<K8sDiscovery> self) {
  std::chrono::milliseconds backoff = options_.min_backoff;
  bool need_list = true;
  while (!stopped_) {
    WatchEnd end = WatchEnd::kFailed;
    if (!need_list || co_await list()) {
      need_list = false;
      end = co_await watch();
    }
    if (stopped_) break;
    if (end == WatchEnd::kRenew) {
      backoff = options_.min_backoff;
      continue;
    }
    if (end == WatchEnd::kGone) {
      // The version was compacted away: whatever changed meanwhile is only in a fresh list.
      need_list = true;
      continue;
    }
    backoff_timer_.expires_after(backoff);
    co_await backoff_timer_.async_wait(kTuple);
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
  (void)self;
}

asio::awaitable<bool> K8sDiscovery::list() {
  std::string body;
  bool too_large = false;
  auto status = co_await get(path(), [&](unsigned, std::string_view piece) {
    too_large = body.size() + piece.size() > options_.max_list_bytes;
    if (!too_large) body.append(piece);
    return !too_large;
  });
  if (!status) {
    failed("list: " + status.error().message);
    co_return false;
  }
  if (too_large) {
    failed("list: the answer exceeds " + std::to_string(options_.max_list_bytes) + " bytes");
    co_return false;
  }
  if (*status != 200) {
    failed("list: HTTP " + std::to_string(*status) + ": " + status_message(body));
    co_return false;
  }
  boost::system::error_code ec;
  const json::value v = json::parse(body, ec);
  const json::object* o = !ec && v.is_object() ? &v.get_object() : nullptr;
  const json::value* items = o ? o->if_contains("items") : nullptr;
  if (!o || !items || !(items->is_array() || items->is_null())) {
    failed("list: the answer is not an EndpointSliceList");
    co_return false;
  }
  std::map<std::string, EndpointSlice> slices;
  if (items->is_array()) {
    for (const auto& item : items->get_array()) {
      auto slice = parse_endpoint_slice(item, target_.port_name);
      if (!slice) {
        failed("list: " + slice.error().message);
        co_return false;
      }
      slices[slice->name] = std::move(*slice);
    }
  }
  if (const auto* meta = o->if_contains("metadata"); meta && meta->is_object()) {
    resource_version_ = get_string(meta->get_object(), "resourceVersion");
  }
  if (failing_) report_(false, "discover-k8s " + target_.ns + "/" + target_.service + ": the API server answers again");
  failing_ = false;
  slices_ = std::move(slices);
  apply(slices_);
  co_return true;
}

asio::awaitable<K8sDiscovery::WatchEnd> K8sDiscovery::watch() {
  const std::string target = path() + "&watch=1&allowWatchBookmarks=true&timeoutSeconds=" +
                             std::to_string(options_.watch_timeout_s) + "&resourceVersion=" + resource_version_;
  std::string pending;  // a line not yet complete
  WatchEnd end = WatchEnd::kRenew;
  bool oversized = false;
  std::string error_body;
  auto status = co_await get(target, [&](unsigned http_status, std::string_view piece) {
    if (http_status != 200) {  // a refused watch: its Status object
      error_body.append(piece.substr(0, 4096));
      return true;
    }
    pending.append(piece);
    std::size_t start = 0;
    for (std::size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1) {
      end = on_watch_event(std::string_view(pending).substr(start, nl - start));
      if (end != WatchEnd::kRenew) return false;
    }
    pending.erase(0, start);
    oversized = pending.size() > options_.max_event_bytes;
    return !oversized;
  });
  if (!status) {
    failed("watch: " + status.error().message);
    co_return WatchEnd::kFailed;
  }
  if (*status == 410) co_return WatchEnd::kGone;
  if (*status != 200) {
    failed("watch: HTTP " + std::to_string(*status) + ": " + status_message(error_body));
    co_return WatchEnd::kFailed;
  }
  if (oversized) {
    failed("watch: an event exceeds " + std::to_string(options_.max_event_bytes) + " bytes");
    co_return WatchEnd::kFailed;
  }
  co_return end;
}

K8sDiscovery::WatchEnd K8sDiscovery::on_watch_event(std::string_view line) {
  if (line.find_first_not_of(" \r\t") == std::string_view::npos) return WatchEnd::kRenew;
  boost::system::error_code ec;
  const json::value v = json::parse(line, ec);
  const json::object* e = !ec && v.is_object() ? &v.get_object() : nullptr;
  const json::value* object = e ? e->if_contains("object") : nullptr;
  if (!object || !object->is_object()) {
    failed("watch: an event is not {\"type\", \"object\"}");
    return WatchEnd::kFailed;
  }
  const std::string type = get_string(*e, "type");
  if (type == "ERROR") {
    const auto* code = object->get_object().if_contains("code");
    if (code && code->is_int64() && code->get_int64() == 410) return WatchEnd::kGone;
    failed("watch: " + status_message(json::serialize(*object)));
    return WatchEnd::kFailed;
  }
  if (const auto* meta = object->get_object().if_contains("metadata"); meta && meta->is_object()) {
    if (auto rv = get_string(meta->get_object(), "resourceVersion"); !rv.empty()) resource_version_ = rv;
  }
  if (type == "BOOKMARK") return WatchEnd::kRenew;
  auto slice = parse_endpoint_slice(*object, target_.port_name);
  if (!slice) {
    failed("watch: " + slice.error().message);
    return WatchEnd::kFailed;
  }
  if (type == "DELETED") {
    slices_.erase(slice->name);
  } else if (type == "ADDED" || type == "MODIFIED") {
    slices_[slice->name] = std::move(*slice);
  } else {
    return WatchEnd::kRenew;  // a type this version does not know
  }
  if (failing_) report_(false, "discover-k8s " + target_.ns + "/" + target_.service + ": the API server answers again");
  failing_ = false;
  apply(slices_);
  return WatchEnd::kRenew;
}

void K8sDiscovery::failed(const std::string& what) {
  if (!failing_) {
    report_(true, "discover-k8s " + target_.ns + "/" + target_.service + ": " + what + "; keeping its " +
                      std::to_string(ours_.size()) + " workers and retrying");
  }
  failing_ = true;
}

void K8sDiscovery::apply(const std::map<std::string, EndpointSlice>& slices) {
  const std::string name = "discover-k8s " + target_.ns + "/" + target_.service;
  // Every endpoint by URL; one ready (and not terminating) in any slice makes the worker ready.
  std::map<std::string, std::pair<WorkerEndpoint, bool>> wanted;
  for (const auto& [slice_name, slice] : slices) {
    if (slice.port.empty()) continue;
    for (const auto& e : slice.endpoints) {
      auto ep = discovered_endpoint(e.address, slice.port, target_.kv_events_port, target_.replay_port, target_.model);
      if (!ep) continue;
      auto [it, fresh] = wanted.try_emplace(ep->url, std::move(*ep), false);
      it->second.second = it->second.second || (e.ready && !e.terminating);
    }
  }
  for (auto& [url, want] : wanted) {
    auto existing = registry_.find_by_url(url);
    const bool ours = ours_.count(url) > 0;
    if (want.second) {
      // One of ours missing from the registry was removed by hand (the admin API): it stays out until it
      // leaves the slices and comes back.
      if (!existing && !ours) {
        if (registry_.add(want.first)) {
          ours_.insert(url);
          report_(false, name + ": worker " + url + " added (ready)");
        }
      } else if (ours && drained_.erase(url)) {
        existing->set_cordoned(false);
        report_(false, name + ": worker " + url + " is ready again");
      }
    } else if (existing && ours && drained_.insert(url).second) {
      // Terminating (or failing its readiness probe): no new requests; those in flight finish.
      existing->set_cordoned(true);
      report_(false, name + ": worker " + url + " drained (terminating or not ready)");
    }
  }
  for (auto it = ours_.begin(); it != ours_.end();) {
    if (wanted.count(*it)) {
      ++it;
      continue;
    }
    if (auto w = registry_.find_by_url(*it)) registry_.remove(w->id());
    report_(false, name + ": worker " + *it + " removed (in no EndpointSlice)");
    drained_.erase(*it);
    it = ours_.erase(it);
  }
}

}  // namespace kvroute::backends
