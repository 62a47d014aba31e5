#include "router/config.h"

#include <charconv>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>

#include <yaml-cpp/yaml.h>

#include "backends/shared_state/shared_state.h"
#include "backends/worker_registry.h"
#include "policy/routing_policy.h"
#include "util/split.h"

namespace kvroute::router {

namespace {

using Setter = std::function<std::optional<std::string>(Config&, const std::string&)>;

struct Option {
  const char* name;  // flag name; the YAML key is the same with '_' for '-'
  const char* arg;   // placeholder in --help, empty for boolean flags
  const char* help;
  Setter set;
  bool repeatable = false;
};

std::optional<std::string> parse_double(const std::string& v, double& out, double min, double max) {
  try {
    std::size_t used = 0;
    double d = std::stod(v, &used);
    if (used != v.size()) return "'" + v + "' is not a number";
    if (d < min || d > max) return "'" + v + "' is out of range [" + std::to_string(min) + ", " + std::to_string(max) + "]";
    out = d;
    return std::nullopt;
  } catch (...) {
    return "'" + v + "' is not a number";
  }
}

template <class Int>
std::optional<std::string> parse_int(const std::string& v, Int& out, Int min, Int max) {
  Int x{};
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec != std::errc() || p != v.data() + v.size()) return "'" + v + "' is not a whole number";
  if (x < min || x > max) return "'" + v + "' is out of range [" + std::to_string(min) + ", " + std::to_string(max) + "]";
  out = x;
  return std::nullopt;
}

std::optional<std::string> parse_bool(const std::string& v, bool& out) {
  if (v == "true" || v == "1" || v == "yes" || v == "on") { out = true; return std::nullopt; }
  if (v == "false" || v == "0" || v == "no" || v == "off") { out = false; return std::nullopt; }
  return "'" + v + "' is not true or false";
}

// A secret kept in a file (a mounted Kubernetes Secret): its contents without the final newline.
std::optional<std::string> read_secret_file(const std::string& path, std::string& out) {
  std::ifstream in(path);
  if (!in) return "cannot read '" + path + "'";
  std::stringstream ss;
  ss << in.rdbuf();
  std::string v = ss.str();
  while (!v.empty() && (v.back() == '\n' || v.back() == '\r')) v.pop_back();
  if (v.empty()) return "'" + path + "' is empty";
  out = std::move(v);
  return std::nullopt;
}

std::optional<std::string> check_host_port(const std::string& v) {
  auto colon = v.rfind(':');
  if (colon == std::string::npos || colon == 0) return "'" + v + "' must be HOST:PORT";
  unsigned port = 0;
  if (auto e = parse_int<unsigned>(v.substr(colon + 1), port, 0, 65535)) return "port in '" + v + "': " + *e;
  return std::nullopt;
}

// "HEAD,KEY=VALUE,...": the items between commas (HEAD first).
std::vector<std::string> split_commas(const std::string& v) {
  const std::vector<std::string_view> items = split(v, ',');
  return {items.begin(), items.end()};
}

// Hands each KEY=VALUE item after the head to `attribute`; the first error (its own, or an item that is not
// KEY=VALUE) is returned.
std::optional<std::string> each_attribute(
    const std::vector<std::string>& parts,
    const std::function<std::optional<std::string>(const std::string& key, const std::string& value)>& attribute) {
  for (std::size_t i = 1; i < parts.size(); ++i) {
    const auto eq = parts[i].find('=');
    const std::string val = eq == std::string::npos ? "" : parts[i].substr(eq + 1);
    if (val.empty()) return "'" + parts[i] + "' must be KEY=VALUE";
    if (auto e = attribute(parts[i].substr(0, eq), val)) return e;
  }
  return std::nullopt;
}

// The attributes --discover and --discover-k8s share.
std::optional<std::string> discover_attributes(const std::vector<std::string>& parts, std::uint16_t& kv_events_port,
                                               std::uint16_t& replay_port, std::string& model) {
  return each_attribute(parts, [&](const std::string& key, const std::string& val) -> std::optional<std::string> {
    if (key == "kv_events_port") {
      if (auto bad = parse_int<std::uint16_t>(val, kv_events_port, 1, 65535)) return "kv_events_port: " + *bad;
    } else if (key == "replay_port") {
      if (auto bad = parse_int<std::uint16_t>(val, replay_port, 1, 65535)) return "replay_port: " + *bad;
    } else if (key == "model") {
      model = val;
    } else {
      return "unknown attribute '" + key + "' (kv_events_port, replay_port, model)";
    }
    return std::nullopt;
  });
}

#define DOUBLE_OPT(field, lo, hi) [](Config& c, const std::string& v) { return parse_double(v, c.field, lo, hi); }
#define INT_OPT(type, field, lo, hi) \
  [](Config& c, const std::string& v) { return parse_int<type>(v, c.field, lo, hi); }

const std::vector<Option>& options() {
  static const std::vector<Option> opts = {
      {"config", "FILE", "YAML file with any of these options (flags given on the command line win)",
       [](Config&, const std::string&) { return std::optional<std::string>(); }},
      {"listen", "HOST:PORT", "address of the OpenAI-compatible API (default 0.0.0.0:8080)",
       [](Config& c, const std::string& v) { auto e = check_host_port(v); if (!e) c.listen = v; return e; }},
      {"admin-listen", "HOST:PORT", "address of /metrics and /admin/* (default 127.0.0.1:9090)",
       [](Config& c, const std::string& v) { auto e = check_host_port(v); if (!e) c.admin_listen = v; return e; }},
      {"worker", "URL[,kv_events=EP][,replay=EP][,model=NAME][,dp=N]",
       "a worker's base URL, http://HOST:PORT, optionally with its KV event publisher (e.g. "
       "kv_events=tcp://HOST:5557) for precise mode; repeat for each worker",
       [](Config& c, const std::string& v) -> std::optional<std::string> {
         const std::vector<std::string> parts = split_commas(v);
         auto ep = backends::parse_worker_url(parts[0]);
         if (!ep) return ep.error().message;
         WorkerConfig w{ep->url, "", "", "", 1};
         auto e = each_attribute(parts, [&](const std::string& key, const std::string& val) -> std::optional<std::string> {
           if (key == "kv_events") w.kv_events = val;
           else if (key == "replay") w.kv_events_replay = val;
           else if (key == "model") w.model = val;
           else if (key == "dp") {
             if (auto bad = parse_int<std::uint32_t>(val, w.dp_size, 1, 1024)) return "dp: " + *bad;
           } else return "unknown worker attribute '" + key + "' (kv_events, replay, model, dp)";
           return std::nullopt;
         });
         if (e) return e;
         c.workers.push_back(std::move(w));
         return std::nullopt;
       },
       true},
      {"discover", "HOST:PORT[,kv_events_port=N][,replay_port=N][,model=NAME]",
       "a DNS name whose addresses are workers, e.g. a Kubernetes headless Service: resolved again every "
       "--discover-interval, an address that appears is added as http://ADDRESS:PORT, one that disappears removed; "
       "repeat for each name",
       [](Config& c, const std::string& v) -> std::optional<std::string> {
         const std::vector<std::string> parts = split_commas(v);
         if (auto e = check_host_port(parts[0])) return e;
         DiscoverConfig d;
         const auto colon = parts[0].rfind(':');
         d.host = parts[0].substr(0, colon);
         d.port = parts[0].substr(colon + 1);
         if (d.host.size() >= 2 && d.host.front() == '[' && d.host.back() == ']') d.host = d.host.substr(1, d.host.size() - 2);
         if (auto e = discover_attributes(parts, d.kv_events_port, d.replay_port, d.model)) return e;
         c.discover.push_back(std::move(d));
         return std::nullopt;
       },
       true},
      {"discover-k8s", "[NAMESPACE/]SERVICE[:PORT_NAME][,kv_events_port=N][,replay_port=N][,model=NAME]",
       "a Kubernetes Service whose EndpointSlices are workers, listed and watched through the API server: a ready "
       "endpoint is added as http://ADDRESS:PORT (the port named PORT_NAME, else the slice's only port), a "
       "terminating or unready one drained (no new requests), one that leaves removed; needs RBAC to list and "
       "watch endpointslices; repeat for each Service",
       [](Config& c, const std::string& v) -> std::optional<std::string> {
         const std::vector<std::string> parts = split_commas(v);
         DiscoverK8sConfig d;
         std::string name = parts[0];
         if (const auto slash = name.find('/'); slash != std::string::npos) {
           d.ns = name.substr(0, slash);
           name = name.substr(slash + 1);
         }
         if (const auto colon = name.find(':'); colon != std::string::npos) {
           d.port_name = name.substr(colon + 1);
           name = name.substr(0, colon);
         }
         d.service = name;
         // Kubernetes object names are DNS labels (RFC 1123): lower case, digits and '-'.
         const auto label = [](const std::string& s) {
           return !s.empty() && s.size() <= 253 && s.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-.") == std::string::npos;
         };
         if (!label(d.service) || (!d.ns.empty() && !label(d.ns)) ||
             (!d.port_name.empty() && !label(d.port_name))) {
           return "'" + parts[0] + "' must be [NAMESPACE/]SERVICE[:PORT_NAME] (lower-case Kubernetes names)";
         }
         if (auto e = discover_attributes(parts, d.kv_events_port, d.replay_port, d.model)) return e;
         c.discover_k8s.push_back(std::move(d));
         return std::nullopt;
       },
       true},
      {"k8s-api-url", "URL", "Kubernetes API server for --discover-k8s (default: in-cluster, "
       "https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT)",
       [](Config& c, const std::string& v) { c.k8s_api_url = v; return std::optional<std::string>(); }},
      {"k8s-token-file", "FILE", "bearer token for the Kubernetes API (default: the pod's service account token)",
       [](Config& c, const std::string& v) { c.k8s_token_file = v; return std::optional<std::string>(); }},
      {"k8s-ca-file", "FILE", "CA bundle of the Kubernetes API server (default: the pod's service account CA)",
       [](Config& c, const std::string& v) { c.k8s_ca_file = v; return std::optional<std::string>(); }},
      {"discover-interval", "SECONDS", "how often --discover names are resolved again (default 5)",
       DOUBLE_OPT(discover_interval_s, 0.05, 3600)},
      {"policy", "NAME", "routing policy (default kv_cost); one of the names listed below",
       [](Config& c, const std::string& v) -> std::optional<std::string> {
         auto p = policy::make_policy(v, policy::PolicyOptions{});  // its error lists the valid names
         if (!p) return p.error().message;
         c.policy = v;
         return std::nullopt;
       }},
      {"threads", "N", "I/O threads (default 0: one per core)", INT_OPT(int, threads, 0, 256)},
      {"max-body-bytes", "N", "largest request body accepted (default 8388608); larger gets 413",
       INT_OPT(std::uint64_t, max_body_bytes, 1024, 1ull << 32)},
      {"request-timeout", "SECONDS",
       "deadline of one upstream exchange, streaming included; unanswered by then: 504 (default 600)",
       DOUBLE_OPT(request_timeout_s, 0.001, 86400)},
      {"connect-timeout", "SECONDS", "deadline to connect to a worker (default 2)", DOUBLE_OPT(connect_timeout_s, 0.001, 600)},
      {"first-byte-timeout", "SECONDS",
       "a streamed request whose worker sent no response head by then goes to another worker, or gets 504 (default 60)",
       DOUBLE_OPT(first_byte_timeout_s, 0.001, 86400)},
      {"max-retries", "N", "retries of one request on other workers after a refused or reset connection, a 502, 503 "
       "or 504, or a first-byte timeout, before any byte reached the client (default 2)", INT_OPT(int, max_retries, 0, 10)},
      {"retry-budget-percent", "P", "retries under way at most P % of the requests in flight, at least 3 (default 20)",
       DOUBLE_OPT(retry_budget_percent, 0, 100)},
      {"outlier-failures", "N", "consecutive failures that eject a worker from rotation (default 5; 0: never)",
       INT_OPT(std::uint32_t, outlier_failures, 0, 1000)},
      {"outlier-ejection", "SECONDS", "first ejection's length; the n-th in a row lasts n times it, at most 300 s or "
       "this (default 30)", DOUBLE_OPT(outlier_ejection_s, 0.001, 86400)},
      {"outlier-max-ejection-percent", "P", "most workers ejected at once, in % of the fleet (one always may, never "
       "the last routable one) (default 50)", DOUBLE_OPT(outlier_max_ejection_percent, 0, 100)},
      {"client-idle-timeout", "SECONDS", "close an idle client connection after this long (default 60)",
       DOUBLE_OPT(client_idle_timeout_s, 0.001, 86400)},
      {"header-read-timeout", "SECONDS",
       "a request head begun, and a TLS handshake, must be complete within this, else 408 and close (default 10)",
       DOUBLE_OPT(header_timeout_s, 0.001, 86400)},
      {"drain-timeout", "SECONDS",
       "on SIGTERM or SIGINT stop accepting connections and let requests in flight finish for up to this long; "
       "a second signal stops at once (default 30; 0: stop at once)",
       DOUBLE_OPT(drain_timeout_s, 0, 86400)},
      {"worker-header", "BOOL", "add x-kvroute-worker to every routed response (default true)",
       [](Config& c, const std::string& v) { return parse_bool(v, c.worker_header); }},
      {"access-log", "BOOL",
       "write one JSON line per API request to stdout: time, request id, method, path, status, worker, routing "
       "reason, prompt / predicted cached / cached tokens, TTFT and duration (default false)",
       [](Config& c, const std::string& v) { return parse_bool(v, c.access_log); }},
      {"block-tokens", "N", "tokens per block when requests carry token ids (default 16)",
       INT_OPT(std::uint32_t, block_tokens, 1, 4096)},
      {"block-bytes", "N", "bytes of routing text per block (default 64)", INT_OPT(std::uint32_t, block_bytes, 4, 65536)},
      {"session-header", "NAME", "request header carrying the session key (default x-session-id)",
       [](Config& c, const std::string& v) -> std::optional<std::string> {
         if (v.empty()) return "must not be empty";
         c.session_header = v;
         return std::nullopt;
       }},
      {"session-ttl", "SECONDS", "idle time after which a session binding is forgotten (default 600)",
       DOUBLE_OPT(session_ttl_s, 0.001, 1e7)},
      {"session-margin", "SECONDS", "a session stays on its worker while the worker's KV pool has room; off a full pool it moves only to a worker whose estimate is better by more than this (default 0.25)",
       DOUBLE_OPT(session_margin_s, 0, 1e6)},
      {"prefix-hold", "SECONDS", "kv_cost, on workers in precise mode: a request whose prefix an earlier request is still computing on the chosen worker waits for that prefix (the earlier request's first token, or the worker's KV event storing it) for at most this long instead of computing it again; not on workers seen to make blocks hits when they schedule them (vLLM v1); 0 never holds (default 0.4)",
       DOUBLE_OPT(prefix_hold_s, 0, 60)},
      {"warm-ups", "BOOL", "kv_cost: when a prefix's requests have paid for a copy of it on another worker in the time they spent on its busy holders, send that worker the prompt alone (one output token, the answer dropped) so that the next ones find it there; likewise the worker a new session is bound to when its first turn goes to the prefix's holder; false makes no such copy (default true)",
       [](Config& c, const std::string& v) { return parse_bool(v, c.warm_ups); }},
      {"max-held-body-bytes", "N",
       "request bodies held at once over all connections; a request beyond it is read once others end (default "
       "536870912)",
       INT_OPT(std::uint64_t, max_held_body_bytes, 1, std::uint64_t{1} << 50)},
      {"max-sessions", "N",
       "session bindings held at most, about 140 bytes each plus keys over 15 bytes; beyond it the least recently used is forgotten "
       "(default 250000)",
       INT_OPT(std::size_t, max_sessions, 1, 100'000'000)},
      {"tenant-header", "NAME", "request header naming the tenant; isolates cache namespaces (default x-tenant-id)",
       [](Config& c, const std::string& v) { c.tenant_header = v; return std::optional<std::string>(); }},
      {"tenant-salt-secret", "SECRET",
       "key of the HMAC that turns a tenant into the cache_salt sent to the workers, so that no tenant shares "
       "another's cached prefixes on a worker; replicas of one fleet share it (default: "
       "$KVROUTE_TENANT_SALT_SECRET, else empty: salts still isolate tenants, but are guessable)",
       [](Config& c, const std::string& v) { c.tenant_salt_secret = v; return std::optional<std::string>(); }},
      {"tenant-salt-secret-file", "FILE", "read --tenant-salt-secret from this file (a Kubernetes Secret)",
       [](Config& c, const std::string& v) { return read_secret_file(v, c.tenant_salt_secret); }},
      {"allow-client-cache-salt", "BOOL",
       "mix a cache_salt the client sends into its tenant's salt instead of dropping it (default false)",
       [](Config& c, const std::string& v) { return parse_bool(v, c.allow_client_cache_salt); }},
      {"api-keys-file", "FILE",
       "client API keys, one 'KEY TENANT' per line ('#' comments): a request needs one as a bearer token (else "
       "401) and its tenant is the key's, never a header's (default: none, no key needed)",
       [](Config& c, const std::string& v) { c.api_keys_file = v; return std::optional<std::string>(); }},
      {"admin-token", "TOKEN",
       "bearer token the admin API requires (default: $KVROUTE_ADMIN_TOKEN; empty: the admin API is open)",
       [](Config& c, const std::string& v) { c.admin_token = v; return std::optional<std::string>(); }},
      {"admin-token-file", "FILE", "read --admin-token from this file (a Kubernetes Secret)",
       [](Config& c, const std::string& v) { return read_secret_file(v, c.admin_token); }},
      {"tls-cert", "FILE", "PEM certificate chain of the API listener: it then speaks HTTPS only (default: plain HTTP)",
       [](Config& c, const std::string& v) { c.tls_cert = v; return std::optional<std::string>(); }},
      {"tls-key", "FILE", "PEM private key of --tls-cert",
       [](Config& c, const std::string& v) { c.tls_key = v; return std::optional<std::string>(); }},
      {"admin-tls-cert", "FILE", "PEM certificate chain of the admin listener (default: --tls-cert's)",
       [](Config& c, const std::string& v) { c.admin_tls_cert = v; return std::optional<std::string>(); }},
      {"admin-tls-key", "FILE", "PEM private key of --admin-tls-cert (default: --tls-key)",
       [](Config& c, const std::string& v) { c.admin_tls_key = v; return std::optional<std::string>(); }},
      {"admin-tls", "BOOL", "serve the admin listener over TLS when a certificate is given (default true)",
       [](Config& c, const std::string& v) { return parse_bool(v, c.admin_tls); }},
      {"max-concurrent-requests", "N",
       "API requests served at once, over all connections; more wait in a queue served round-robin across "
       "tenants (default 0: no cap)",
       INT_OPT(std::size_t, max_concurrent_requests, 0, 10'000'000)},
      {"max-queued-requests", "N",
       "requests waiting beyond --max-concurrent-requests; past it 429 with Retry-After (default 1024)",
       INT_OPT(std::size_t, max_queued_requests, 0, 10'000'000)},
      {"queue-timeout", "SECONDS", "longest wait in that queue, then 429 with Retry-After (default 30)",
       DOUBLE_OPT(queue_timeout_s, 0.001, 86400)},
      {"response-ids", "N",
       "Responses API ids remembered with the worker that stored them, so that a request naming one as "
       "previous_response_id goes there (default 100000; the least recently seen are forgotten first)",
       INT_OPT(std::size_t, response_ids, 1, 100'000'000)},
      {"kv-events-topic", "PREFIX", "ZMQ topic prefix of the workers' KV events (default: all topics)",
       [](Config& c, const std::string& v) { c.kv_events_topic = v; return std::optional<std::string>(); }},
      {"tokenize", "MODE",
       "hash text prompts over the workers' own token ids from their /tokenize: auto (while any worker is in "
       "precise mode), always, never (default auto)",
       [](Config& c, const std::string& v) -> std::optional<std::string> {
         if (v != "auto" && v != "always" && v != "never") return "'" + v + "' is not auto, always or never";
         c.tokenize = v;
         return std::nullopt;
       }},
      {"worker-api-key", "KEY",
       "API key of workers started with one (vllm serve --api-key): sent as a bearer token with kvroute's own "
       "requests to them, such as /v1/models (default: $KVROUTE_WORKER_API_KEY; clients' requests carry their own)",
       [](Config& c, const std::string& v) { c.worker_api_key = v; return std::optional<std::string>(); }},
      {"tokenize-timeout", "SECONDS", "give up on /tokenize and hash the text after this long (default 0.25)",
       DOUBLE_OPT(tokenize_timeout_s, 0.001, 60)},
      {"tokenize-cache", "N", "prompts whose token ids are remembered (default 4096; 0 disables)",
       INT_OPT(std::size_t, tokenize_cache_entries, 0, 10'000'000)},
      {"health-interval", "SECONDS",
       "interval of active health checks, GET /health; a passing worker's /v1/models is read too, every 30 s "
       "(default 2)",
       DOUBLE_OPT(health_interval_s, 0.01, 3600)},
      {"health-timeout", "SECONDS", "deadline of one health check (default 1)", DOUBLE_OPT(health_timeout_s, 0.001, 600)},
      {"unhealthy-threshold", "N", "consecutive failed checks that take a worker out (default 2)",
       INT_OPT(int, unhealthy_threshold, 1, 100)},
      {"healthy-threshold", "N", "consecutive good checks that bring it back (default 2)",
       INT_OPT(int, healthy_threshold, 1, 100)},
      {"metrics-interval", "SECONDS", "poll each worker's /metrics this often; 0 disables (default 1)",
       DOUBLE_OPT(metrics_interval_s, 0, 3600)},
      {"worker-kv-blocks", "N", "KV capacity of a worker in blocks when it reports none (default 0: unbounded)",
       INT_OPT(std::uint64_t, worker_kv_blocks, 0, 1ull << 40)},
      {"prefill-tokens-per-s", "N",
       "prefill rate assumed before it is learned (default 20000); learning moves at most 4x from it",
       DOUBLE_OPT(prefill_tokens_per_s, 1, 1e9)},
      {"decode-step-s", "SECONDS",
       "time of one decode step of a small batch assumed before it is learned from inter-token latency "
       "(default 0.02); learning moves at most 4x from it",
       DOUBLE_OPT(decode_step_s, 1e-6, 10)},
      {"worker-max-seqs", "N",
       "the workers' cap on running sequences (vLLM --max-num-seqs, SGLang --max-running-requests); kv_cost "
       "prices admission beyond it and sessions are not moved onto a worker with 70 % of it in flight "
       "(default 256)",
       INT_OPT(std::uint32_t, worker_max_seqs, 1, 1u << 20)},
      {"priority-header", "NAME",
       "request header whose value 'sheddable' lets the router refuse the request with 429 while every worker "
       "that could serve it is saturated (so does the OpenAI field \"service_tier\": \"flex\") (default "
       "x-kvroute-priority)",
       [](Config& c, const std::string& v) -> std::optional<std::string> {
         if (v.empty()) return "must not be empty";
         c.priority_header = v;
         return std::nullopt;
       }},
      {"shed-queue-depth", "N",
       "a worker is saturated for sheddable requests with this many requests waiting (its polled queue, or "
       "the router's in-flight count beyond --worker-max-seqs) (default 5)",
       INT_OPT(std::uint32_t, shed_queue_depth, 1, 1u << 20)},
      {"shed-kv-usage", "X", "a worker is saturated for sheddable requests with this share of its KV cache in use, 0-1 "
       "(default 0.8)",
       DOUBLE_OPT(shed_kv_usage, 0, 1)},
      {"kv-cost-alpha", "X", "kv_cost weight of the recompute a request causes: evicted reused blocks, prefixes "
       "duplicated from another worker (default 1)", DOUBLE_OPT(kv_cost_alpha, 0, 1e6)},
      {"kv-cost-beta", "X", "kv_cost: share of a request's decode the requests already running on its worker "
       "overlap (default 0.5)", DOUBLE_OPT(kv_cost_beta, 0, 1e6)},
      {"shared-state", "redis://[:PASSWORD@]HOST:PORT[/DB]",
       "share routing state with the other router replicas through this Redis: predicted prefixes, load, "
       "sessions, response ids, cordons and admin-added workers, learned rates (default: none, a replica alone; "
       "the password may also come from $KVROUTE_SHARED_STATE_PASSWORD)",
       [](Config& c, const std::string& v) -> std::optional<std::string> {
         if (auto url = shared_state::parse_redis_url(v); !url) return url.error().message;
         c.shared_state = v;
         return std::nullopt;
       }},
      {"shared-state-prefix", "P", "prefix of every key in --shared-state, one deployment's apart from another's (default kvroute)",
       [](Config& c, const std::string& v) -> std::optional<std::string> {
         if (v.empty() || v.find_first_of(" \t\n") != std::string::npos) return "'" + v + "' must be a non-empty word";
         c.shared_state_prefix = v;
         return std::nullopt;
       }},
      {"shared-state-interval", "SECONDS", "how often a replica publishes its load per worker (default 0.025)",
       DOUBLE_OPT(shared_state_interval_s, 0.001, 10)},
      {"shared-state-stagger", "on|off",
       "replicas take turns on requests that reach several of them at once: in bursts, a long prompt waits a few "
       "stream delays so that each replica sees the others' decisions (default on; docs/operations.md)",
       [](Config& c, const std::string& v) { return parse_bool(v, c.shared_state_stagger); }},
      {"log-level", "LEVEL", "error, warn, info or debug (default info)",
       [](Config& c, const std::string& v) -> std::optional<std::string> {
         if (v != "error" && v != "warn" && v != "info" && v != "debug") return "'" + v + "' is not error, warn, info or debug";
         c.log_level = v;
         return std::nullopt;
       }},
  };
  return opts;
}

const Option* find_option(std::string_view name) {
  for (const auto& o : options()) {
    if (name == o.name) return &o;
  }
  return nullptr;
}

std::string yaml_key(const char* flag) {
  std::string k(flag);
  for (char& ch : k) if (ch == '-') ch = '_';
  return k;
}

std::optional<std::string> apply_worker_node(Config& cfg, const YAML::Node& w) {
  if (w.IsScalar()) return find_option("worker")->set(cfg, w.as<std::string>());
  if (!w.IsMap() || !w["url"]) {
    return std::string("each worker is a URL or a map with 'url' (and optional 'kv_events', 'kv_events_replay', 'model', 'dp_size')");
  }
  if (auto e = find_option("worker")->set(cfg, w["url"].as<std::string>())) return e;
  for (const auto& kv : w) {
    const std::string key = kv.first.as<std::string>();
    if (key == "url") continue;
    const std::string val = kv.second.as<std::string>();
    if (key == "kv_events") cfg.workers.back().kv_events = val;
    else if (key == "kv_events_replay") cfg.workers.back().kv_events_replay = val;
    else if (key == "model") cfg.workers.back().model = val;
    else if (key == "dp_size") {
      if (auto e = parse_int<std::uint32_t>(val, cfg.workers.back().dp_size, 1, 1024)) return "dp_size: " + *e;
    } else return "unknown worker key '" + key + "' (url, kv_events, kv_events_replay, model, dp_size)";
  }
  return std::nullopt;
}

}  // namespace

Result<Config> apply_yaml(Config cfg, const std::string& text, const std::string& origin) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return make_error(origin + ": " + e.what());
  }
  if (root.IsNull()) return cfg;
  if (!root.IsMap()) return make_error(origin + ": the top level must be a map of options");
  try {
    for (const auto& kv : root) {
      const std::string key = kv.first.as<std::string>();
      if (key == "workers") {
        if (!kv.second.IsSequence()) return make_error(origin + ": 'workers' must be a list");
        cfg.workers.clear();
        for (const auto& w : kv.second) {
          if (auto e = apply_worker_node(cfg, w)) return make_error(origin + ": workers: " + *e);
        }
        continue;
      }
      if (key == "discover" || key == "discover_k8s") {  // a list of names in the flag's form
        if (!kv.second.IsSequence()) return make_error(origin + ": '" + key + "' must be a list");
        if (key == "discover") cfg.discover.clear();
        if (key == "discover_k8s") cfg.discover_k8s.clear();
        const Option* o = find_option(key == "discover" ? "discover" : "discover-k8s");
        for (const auto& d : kv.second) {
          if (!d.IsScalar()) return make_error(origin + ": " + key + ": each item is " + o->arg);
          if (auto e = o->set(cfg, d.as<std::string>())) return make_error(origin + ": " + key + ": " + *e);
        }
        continue;
      }
      const Option* opt = nullptr;
      for (const auto& o : options()) {
        if (yaml_key(o.name) == key && std::string_view(o.name) != "config" && std::string_view(o.name) != "worker" &&
            std::string_view(o.name) != "discover" && std::string_view(o.name) != "discover-k8s") {
          opt = &o;
        }
      }
      if (opt == nullptr) return make_error(origin + ": unknown option '" + key + "'");
      if (!kv.second.IsScalar()) return make_error(origin + ": '" + key + "' must be a single value");
      if (auto e = opt->set(cfg, kv.second.as<std::string>())) return make_error(origin + ": " + key + ": " + *e);
    }
  } catch (const YAML::Exception& e) {
    return make_error(origin + ": " + e.what());
  }
  return cfg;
}

Result<Config> load_config(int argc, const char* const* argv, bool* help_requested) {
  Config cfg;
  // A secret is better kept out of the command line and the config file (both readable by others): the
  // environment provides the default.
  if (const char* key = std::getenv("KVROUTE_WORKER_API_KEY")) cfg.worker_api_key = key;
  if (const char* token = std::getenv("KVROUTE_ADMIN_TOKEN")) cfg.admin_token = token;
  if (const char* secret = std::getenv("KVROUTE_TENANT_SALT_SECRET")) cfg.tenant_salt_secret = secret;
  // Split "--name=value" and "--name value"; find --config first so flags override the file.
  std::vector<std::pair<std::string, std::string>> flags;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      if (help_requested) *help_requested = true;
      return cfg;
    }
    if (!a.starts_with("--")) return make_error("unexpected argument '" + a + "' (options start with --; see --help)");
    std::string name = a.substr(2), value;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else {
      if (i + 1 >= argc) return make_error("--" + name + " needs a value (see --help)");
      value = argv[++i];
    }
    if (find_option(name) == nullptr) return make_error("unknown option --" + name + " (see --help)");
    flags.emplace_back(name, value);
  }
  for (const auto& [name, value] : flags) {
    if (name != "config") continue;
    std::ifstream in(value);
    if (!in) return make_error("--config: cannot read '" + value + "'");
    std::stringstream ss;
    ss << in.rdbuf();
    auto r = apply_yaml(std::move(cfg), ss.str(), value);
    if (!r) return r.error();
    cfg = std::move(*r);
  }
  bool workers_from_flags = false, discover_from_flags = false, k8s_from_flags = false;
  for (const auto& [name, value] : flags) {
    if (name == "config") continue;
    if (name == "worker" && !workers_from_flags) {
      cfg.workers.clear();  // --worker flags replace the file's list
      workers_from_flags = true;
    }
    if (name == "discover" && !discover_from_flags) {
      cfg.discover.clear();  // and --discover flags the file's names
      discover_from_flags = true;
    }
    if (name == "discover-k8s" && !k8s_from_flags) {
      cfg.discover_k8s.clear();
      k8s_from_flags = true;
    }
    if (auto e = find_option(name)->set(cfg, value)) return make_error("--" + name + ": " + *e);
  }
  return cfg;
}

std::string help_text() {
  std::ostringstream out;
  out << "kvroute: a prefix-cache-aware router for OpenAI-compatible LLM workers\n\n"
         "usage: kvroute [--config FILE] [--worker URL ...] [options]\n\n"
         "Every option can also be set in the YAML file under the same name with '_' for '-'\n"
         "(workers: a list of URLs, or of maps {url, kv_events, kv_events_replay, model, dp_size}).\n\noptions:\n";
  for (const auto& o : options()) {
    std::string left = std::string("  --") + o.name + (o.arg[0] ? std::string(" ") + o.arg : "");
    out << left;
    out << std::string(left.size() < 34 ? 34 - left.size() : 1, ' ') << o.help << (o.repeatable ? " [repeatable]" : "")
        << "\n";
  }
  out << "  --help                          this text\n\npolicies:";
  for (const auto& n : policy::policy_names()) out << " " << n;
  out << "\n";
  return out.str();
}

}  // namespace kvroute::router
