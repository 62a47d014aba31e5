// Configuration of the kvroute daemon: a YAML file plus command-line flags that override it.
//
// Every option has one name used in both places (`--admin-listen` on the command line is `admin_listen` in
// YAML) and one line of help; `kvroute --help` prints the table. Errors name the option and the bad value.
//
//   auto cfg = load_config(argc, argv);   // reads --config FILE first, then applies the other flags
//   if (!cfg) { std::cerr << cfg.error().message; return 2; }
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "util/result.h"

namespace kvroute::router {

struct WorkerConfig {
  std::string url;
  std::string kv_events;         // ZMQ endpoint of the worker's KV event publisher (precise mode), optional
  std::string kv_events_replay;  // ZMQ endpoint of its replay socket, optional
  std::string model;             // model whose namespace its events belong to; empty: ask its /v1/models
  std::uint32_t dp_size = 1;     // data-parallel ranks publishing events on consecutive ports (vLLM's layout)
};

// A DNS name whose addresses are workers (a Kubernetes headless Service), re-resolved every
// Config::discover_interval_s (backends/discovery.h).
struct DiscoverConfig {
  std::string host;
  std::string port;
  std::uint16_t kv_events_port = 0;  // > 0: each address's KV event publisher, tcp://ADDRESS:PORT (precise mode)
  std::uint16_t replay_port = 0;     // > 0: its replay socket
  std::string model;                 // namespace of the events; empty: ask each worker's /v1/models
};

// A Kubernetes Service whose EndpointSlices are workers, listed and watched through the API server
// (backends/discovery_k8s.h).
struct DiscoverK8sConfig {
  std::string ns;         // empty: the pod's own namespace
  std::string service;
  std::string port_name;  // empty: each slice's only port
  std::uint16_t kv_events_port = 0;
  std::uint16_t replay_port = 0;
  std::string model;
};

struct Config {
  std::string listen = "0.0.0.0:8080";
  std::string admin_listen = "127.0.0.1:9090";
  std::vector<WorkerConfig> workers;
  std::vector<DiscoverConfig> discover;
  double discover_interval_s = 5;
  std::vector<DiscoverK8sConfig> discover_k8s;
  // The Kubernetes API for discover_k8s; empty: in-cluster (the pod's service account).
  std::string k8s_api_url;
  std::string k8s_token_file;
  std::string k8s_ca_file;
  std::string policy = "kv_cost";
  int threads = 0;  // 0: one per core

  // Request handling.
  std::uint64_t max_body_bytes = 8ull << 20;
  double request_timeout_s = 600;   // whole upstream exchange
  double connect_timeout_s = 2;
  // A streamed request whose worker has not sent its response head by then is given up on that worker (and
  // retried elsewhere, or answered 504). vLLM and SGLang send a stream's head once the request is admitted,
  // before its prefill, so a minute allows for a long queue and tokenization of the longest prompts while a
  // hung worker costs a client a minute, not --request-timeout.
  double first_byte_timeout_s = 60;
  // Failover (docs/reliability.md, "Failures"): retries on another worker (router/retry_budget.h) and passive
  // outlier detection (backends/outlier_detector.h), with Envoy's defaults except where noted there.
  int max_retries = 2;
  double retry_budget_percent = 20;
  std::uint32_t outlier_failures = 5;     // 0: no ejections
  double outlier_ejection_s = 30;
  double outlier_max_ejection_percent = 50;
  double client_idle_timeout_s = 60;
  // A request head begun must be complete within this (else 408), as must a TLS handshake. 10 s: a head is a
  // few hundred bytes, sent at once by every real client; nginx allows 60 s (client_header_timeout), Envoy has
  // request_headers_timeout (off by default). A trickle of header bytes then holds a connection 10 s, not 60.
  double header_timeout_s = 10;
  double drain_timeout_s = 30;      // on SIGTERM, how long requests in flight may take to finish
  bool worker_header = true;        // add x-kvroute-worker to responses
  bool access_log = false;          // one JSON line per API request on stdout

  // Hashing (docs/hashing.md).
  std::uint32_t block_tokens = 16;
  std::uint32_t block_bytes = 64;

  // Session affinity.
  std::string session_header = "x-session-id";
  double session_ttl_s = 600;
  double session_margin_s = 0.25;  // policy::PolicyOptions explains the default
  // kv_cost holds a request whose prefix an earlier request is still computing on its worker (precise mode)
  // for at most this long (hashing/computing_prefixes.h); 0 never holds. 0.4 s: the benchmark's default (1 s
  // lost two synthetic-trace cells: a long prompt held behind another's prefill loses its place in the queue).
  double prefix_hold_s = 0.4;
  // kv_cost's bought copies of a prefix, and the prefix of a session bound elsewhere than its first turn, are made
  // off any request's path: the worker gets the prompt alone, for one output token (router/warm_up.h). Off: a bought
  // copy is not made at all (the request stays where it is), and a session is bound where its first turn goes.
  bool warm_ups = true;
  // Session bindings held at most (about 140 bytes each, plus keys longer than 15 bytes); beyond it the least
  // recently used is forgotten. Clients that send a new session id or `user` with every request would
  // otherwise grow the map for a whole --session-ttl.
  std::size_t max_sessions = 250000;
  // Request bodies held at once, over all connections (BodyBudget in router/services.h). 512 MiB leaves
  // room for the index and buffers in the chart's 2 GiB memory limit.
  std::uint64_t max_held_body_bytes = 512ull << 20;
  std::string tenant_header = "x-tenant-id";
  // Tenant isolation on the workers (router/cache_salt.h) and authentication (router/auth.h).
  std::string tenant_salt_secret;      // --tenant-salt-secret(-file), $KVROUTE_TENANT_SALT_SECRET
  bool allow_client_cache_salt = false;
  std::string api_keys_file;           // empty: clients need no key
  std::string admin_token;             // --admin-token(-file), $KVROUTE_ADMIN_TOKEN; empty: admin API open
  // TLS (router/client_stream.h): PEM certificate chain and key of the API listener and of the admin listener;
  // empty: plain TCP. The admin listener takes the API's pair unless given its own.
  std::string tls_cert, tls_key, admin_tls_cert, admin_tls_key;
  bool admin_tls = true;  // --admin-tls false: the admin listener stays plain while the API speaks TLS
  // Admission control (router/admission.h). 0: no cap, the default: the right cap is the fleet's capacity
  // (workers x their max running sequences, which vLLM queues beyond on its own), unknown to a fixed default,
  // and a cap set too low turns a burst the workers would absorb into 429s.
  std::size_t max_concurrent_requests = 0;
  std::size_t max_queued_requests = 1024;  // waiting beyond the cap; past it: 429
  double queue_timeout_s = 30;             // longest wait in that queue; then 429
  // Responses API: response ids remembered with the worker that stored them (previous_response_id).
  std::size_t response_ids = 100000;

  // Precise mode (KV events).
  std::string kv_events_topic;      // ZMQ topic prefix to subscribe to; empty: all
  std::string tokenize = "auto";    // auto (while any worker is in precise mode), always, never
  double tokenize_timeout_s = 0.25;
  // Workers' API key (vllm serve --api-key) for kvroute's own requests to them; clients' requests carry theirs.
  std::string worker_api_key;
  // "Bearer KEY", or empty without a key.
  std::string worker_authorization() const { return worker_api_key.empty() ? std::string() : "Bearer " + worker_api_key; }
  std::size_t tokenize_cache_entries = 4096;

  // Health checks.
  double health_interval_s = 2;
  double health_timeout_s = 1;
  int unhealthy_threshold = 2;
  int healthy_threshold = 2;

  // Worker telemetry and the cost model.
  double metrics_interval_s = 1;    // poll each worker's /metrics; 0 disables
  std::uint64_t worker_kv_blocks = 0;  // KV capacity per worker in blocks when the worker reports none
  double prefill_tokens_per_s = 20000;  // starting prefill rate before learning
  double decode_step_s = 0.02;          // starting decode step (empty batch) before learning
  std::uint32_t worker_max_seqs = 256;  // a worker's cap on running sequences (vLLM --max-num-seqs)
  // Load shedding (Router::route): a request marked sheddable is refused with 429 while no worker that could
  // serve it has room. The thresholds are those of the Kubernetes Gateway API Inference Extension's
  // saturation detector (pkg/epp/saturationdetector: waiting queue 5, KV cache utilization 0.8).
  std::string priority_header = "x-kvroute-priority";
  std::uint32_t shed_queue_depth = 5;
  double shed_kv_usage = 0.8;
  double kv_cost_alpha = 1.0;
  double kv_cost_beta = 0.5;

  // Router replicas (router/replica_sync.h): Redis URL, or empty for a replica alone.
  std::string shared_state;
  std::string shared_state_prefix = "kvroute";
  // Load published every this often (the others price workers by it: tens of milliseconds, architecture
  // section 11), expiring after 40 intervals (at least 1 s) without a refresh.
  double shared_state_interval_s = 0.025;
  // In bursts, replicas take turns (policy::BurstStagger, Router::stagger_s).
  bool shared_state_stagger = true;

  std::string log_level = "info";
};

// Parses argv (argv[0] skipped). Returns the config, or an error; `--help` sets *help_requested.
Result<Config> load_config(int argc, const char* const* argv, bool* help_requested = nullptr);
// Applies a YAML document (the contents of a config file) on top of `cfg`.
Result<Config> apply_yaml(Config cfg, const std::string& yaml_text, const std::string& origin);
std::string help_text();

}  // namespace kvroute::router
