// SimWorker: one simulated vLLM worker in real time: an Engine advanced by a steady_timer, its HTTP
// listener, its KV-event publisher and its metrics.
//
// Time: engine time (seconds) = wall seconds since the worker started x speed. The timer is always armed
// for the engine's next_event_time(), mapped back to wall time, so an idle worker costs nothing and a busy
// one wakes once per engine step (or less: advance() runs every step that ended by `now`).
//
// Native KV events (--kv-events-format native) also carry the worker's load (LoadReport): on every event
// batch whose load differs from the last report, in a batch of its own when the load changed and no event
// batch came within a tenth of the load interval, and at least once per load interval (a heartbeat for an idle
// worker). Every load-only batch uses a sequence number and a replay slot, like any batch.
//
// Threading: everything (acceptor, sessions, timers, engine, PUB socket) runs on the one io_context thread
// that the SimServer runs; that thread is the implicit strand, so nothing here takes a lock. Only the
// KV-event replay thread is separate (see kv_events.h).
//
// Requests: submit() hands the engine a SimRequest whose block hashes cover prompt + output tokens (the
// output is deterministic, so its blocks get cached as decoding fills them, as on vLLM), and reports
// progress to the RequestObserver until on_finish or cancel(). The observer (an HTTP session) is kept alive
// by the worker while its request is in flight.
//
// Responses API: each worker has its own ResponseStore (responses()), like each vLLM server has its own
// memory, so a previous_response_id resolves only on the worker that made the response. Sessions read and
// write it on the io thread, like everything else here. A background response's observer is not a session
// but an object that updates its stored entry as the request runs (session.cc, BackgroundResponse).
//
//   auto w = SimWorker::create(io, config);        // Result<std::shared_ptr<SimWorker>>
//   w.value()->start();                            // accept connections
//   auto id = worker.submit(std::move(api_request), session);   // session->on_token(...) follows
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backends/events/telemetry.h"
#include "backends/sim/engine.h"
#include "backends/sim/server/kv_events.h"
#include "backends/sim/server/openai_api.h"
#include "backends/sim/server/response_store.h"
#include "util/result.h"

namespace kvroute::sim {

// What a session learns about its request. Called on the io thread, from inside the engine's advance().
class RequestObserver {
 public:
  virtual ~RequestObserver() = default;
  virtual void on_first_token(std::uint32_t cached_tokens) = 0;
  // Output token `index` is ready; its text is generated_piece(fingerprint, index).
  virtual void on_token(std::uint32_t index) = 0;
  virtual void on_finish(const ApiUsage& usage) = 0;
};

struct SimWorkerConfig {
  int index = 0;  // worker number in the process (names, ports)
  std::string host;
  std::uint16_t port = 0;
  EngineConfig engine;
  ApiLimits limits;         // served model name, max_model_len, defaults
  double speed = 1.0;
  std::uint64_t seed = 0;
  std::size_t max_body_bytes = 8u << 20;
  double idle_timeout_s = 60;
  unsigned fail_status = 0;  // --fault CODE: inference requests answered with it
  bool hang = false;         // --fault hang: inference requests never answered
  std::string api_key;  // non-empty: /v1 routes need "Authorization: Bearer KEY" (vLLM's AuthenticationMiddleware)
  // LoRA adapters loaded at start (vllm serve --lora-modules NAME=PATH): requests may name them as their model.
  std::vector<std::pair<std::string, std::string>> lora_modules;
  // KV events; empty endpoint = off.
  KvEventPublisherConfig kv_events;
  KvEventEncoding kv_events_encoding = KvEventEncoding::kPositional;  // kNative adds LoadReports
  double kv_events_load_interval_s = 1.0;  // native: longest wall time between two LoadReports
  double kv_events_delay_s = 0;            // every batch is published this many wall seconds late
  void* zmq_context = nullptr;
};

class SimWorker : public std::enable_shared_from_this<SimWorker> {
 public:
  static Result<std::shared_ptr<SimWorker>> create(boost::asio::io_context& io, SimWorkerConfig config);
  ~SimWorker();

  void start();  // begin accepting
  void stop();   // stop accepting and advancing; in-flight requests are dropped with their sessions

  struct Submitted {
    std::uint64_t id = 0;
    std::uint64_t fingerprint = 0;  // seed of the generated text (see tokenizer.h)
  };
  Result<Submitted> submit(ApiRequest request, std::shared_ptr<RequestObserver> observer);
  // Removes an in-flight request (client gone). Unknown ids are ignored.
  void cancel(std::uint64_t id);

  // vLLM's POST /reset_prefix_cache: drops every cached block (AllBlocksCleared is published). False while
  // a request holds blocks, as vLLM refuses then too.
  bool reset_prefix_cache();

  // The Responses API responses this worker stored (store=true).
  ResponseStore& responses() { return responses_; }

  // vLLM's runtime LoRA updating (POST /v1/load_lora_adapter, /v1/unload_lora_adapter), with its errors. An
  // adapter's requests have a cache namespace of their own, as vLLM keys blocks by their LoRA, and its blocks'
  // KV events carry its name.
  Result<std::string> load_lora_adapter(const std::string& name, const std::string& path);
  Result<std::string> unload_lora_adapter(const std::string& name);

  const SimWorkerConfig& config() const { return config_; }
  std::uint16_t port() const { return config_.port; }
  std::string models_json() const;
  std::string metrics_text() const;
  std::string kv_blocks_json() const;

 private:
  SimWorker(boost::asio::io_context& io, SimWorkerConfig config, Engine engine);
  class Sink;
  friend class Sink;

  double engine_now();
  void arm_timer();
  void on_timer(boost::system::error_code ec);
  void run_advance(double now);
  void do_accept();
  // Publishes the batch of one advance (native: with the load when it changed; see the header comment).
  void publish(KvEventBatch& batch);
  // Sends one batch now, with `load` as its last event when not null.
  void send(KvEventBatch& batch, const events::WorkerTelemetry* load);
  bool native_events() const { return publisher_ && config_.kv_events_encoding == KvEventEncoding::kNative; }
  events::WorkerTelemetry load_report() const;
  void arm_load_timer(std::chrono::steady_clock::time_point when);
  void on_load_timer(boost::system::error_code ec);

  boost::asio::io_context& io_;
  SimWorkerConfig config_;
  Engine engine_;
  boost::asio::ip::tcp::acceptor acceptor_;
  boost::asio::steady_timer accept_retry_;  // a failed accept (out of descriptors) is retried after a pause
  boost::asio::steady_timer timer_;
  std::chrono::steady_clock::time_point armed_for_ = std::chrono::steady_clock::time_point::max();
  std::chrono::steady_clock::time_point start_;
  std::unique_ptr<KvEventPublisher> publisher_;
  // Native LoadReports (io thread only, like everything here).
  boost::asio::steady_timer load_timer_;
  // --kv-events-delay: encoded batches waiting for their time, oldest first, and the timer of the oldest.
  std::deque<std::pair<std::chrono::steady_clock::time_point, std::string>> delayed_;
  boost::asio::steady_timer delay_timer_;
  void publish_delayed();  // publishes the batches due, then waits for the next
  void arm_delay_timer();  // wakes publish_delayed() when the oldest waiting batch is due
  std::chrono::steady_clock::time_point load_armed_for_ = std::chrono::steady_clock::time_point::max();
  std::chrono::steady_clock::time_point load_sent_at_{};
  std::optional<events::WorkerTelemetry> load_sent_;  // the last report published
  bool load_dirty_ = false;                           // the load changed since load_sent_ and is not sent yet
  bool stopped_ = false;
  double last_now_ = 0;           // engine time never goes back
  double armed_engine_time_ = 0;  // engine time the timer is armed for
  bool in_advance_ = false;
  std::vector<std::uint64_t> pending_cancels_;  // cancel() calls made from inside advance()
  std::uint64_t next_id_ = 1;
  std::int64_t created_ = 0;

  struct Inflight {
    std::shared_ptr<RequestObserver> observer;
    std::string lora;                   // the adapter the request runs with; empty: the base model
    std::string cache_salt;             // the request's cache_salt; empty: none
    std::vector<std::uint32_t> tokens;  // prompt + output, the source of BlockStored token_ids
    double submitted_at = 0;            // engine time
    std::uint32_t prompt_tokens = 0;
  };
  std::unordered_map<std::uint64_t, Inflight> inflight_;
  // Token ids of every block some medium holds (BlockStored of the CPU tier may come after the request
  // that computed the block is gone). Value: 16 token ids + a bit per medium holding the block.
  struct BlockTokens {
    std::vector<std::uint32_t> tokens;
    std::uint8_t media = 0;
    std::string lora;  // the adapter whose namespace the block is in (BlockStored's lora_name)
    std::string salt;  // the cache_salt of a prompt's first block (BlockStored's extra_keys[0]); else empty
  };
  std::unordered_map<std::uint64_t, BlockTokens> block_tokens_;
  ResponseStore responses_;
  // Loaded LoRA adapters, in load order: names (config_.limits.lora_adapters points here) and paths.
  std::vector<std::string> lora_names_;
  std::vector<std::string> lora_paths_;

  // Metrics kept by the server itself (the engine's counters come from stats()).
  std::vector<std::uint64_t> ttft_counts_ = std::vector<std::uint64_t>(23);  // per bucket, +Inf last
  double ttft_sum_ = 0;
  std::uint64_t ttft_count_ = 0;
  std::vector<std::uint64_t> e2e_counts_ = std::vector<std::uint64_t>(22);
  double e2e_sum_ = 0;
  std::uint64_t e2e_count_ = 0;
  std::uint64_t requests_success_ = 0;
  std::uint64_t requests_rejected_ = 0;
  std::uint64_t kv_event_batches_ = 0;
};

}  // namespace kvroute::sim
