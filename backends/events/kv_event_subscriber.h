// KvEventSubscriber: one worker's KV-event stream over ZMQ, applied to the PrefixIndex (precise mode;
// architecture section 9, docs/events.md).
//
// Per data-parallel rank r it connects a SUB socket to the publisher at the configured endpoint's port + r
// (vLLM's layout) with the configured topic filter, and reads three-frame messages [topic, seq, payload]:
// seq is an 8-byte big-endian counter from 0 that restarts with the engine; the payload is vLLM msgpack, or a
// kvroute.v1.EventBatch when the topic starts with "kvroute.v1" (native stream). Per rank:
//  * seq == last + 1: decode and apply;
//  * seq >  last + 1 (a gap): ask the replay ROUTER (replay endpoint's port + r) with a DEALER
//    [empty, start_seq BE8]; it answers [empty, seq, payload] per buffered batch with seq >= start_seq and
//    then [empty, -1 as signed BE8, empty]. If the replay cannot fill the gap (no replay endpoint, timeout,
//    the buffer starts later), the rank's entries are reset and the stream continues from the new batch;
//  * seq <= last: the publisher restarted (its counter starts again at 0): reset the rank's entries and
//    continue; copies of batches already applied by a replay are recognised and skipped;
//  * on the first message of a rank (joining a running engine), the replay buffer is read from 0 first,
//    so the router learns blocks stored before it connected.
// A frame that is malformed, oversized or undecodable is counted and skipped; it never stops the stream.
//
// Liveness: a stream is live while every rank's SUB socket is connected (ZMTP heartbeats detect a dead peer)
// and, if stale_after > 0, a message arrived within stale_after. vLLM publishes only when its cache changes,
// so silence alone is not staleness unless configured. The router keeps a worker in precise mode while
// live() and falls back to approximate mode otherwise.
//
//   SubscriberOptions o;
//   o.applier = applier_options(w, "llama-3.1-8b");
//   o.endpoint = "tcp://10.0.0.7:5557";
//   o.replay_endpoint = "tcp://10.0.0.7:5558";
//   KvEventSubscriber sub(index, o);
//   sub.set_liveness_listener([](WorkerId w, bool live, std::string_view why) { ... });
//   if (auto st = sub.start(); !st) log(st.error().message);
//   ... sub.live(), sub.status() ...
//   sub.stop();   // or destroy it
//
// Threading: start() spawns one thread that owns the sockets and the KvEventApplier; stop() (any thread but
// the listeners') joins it, within about poll_interval. status(), live() and counters are safe from any
// thread: counters are relaxed atomics, the applier's figures are a snapshot guarded by snapshot_mu_.
// Listeners run on the subscriber thread; they must be quick and must not call stop().
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "backends/events/event_applier.h"
#include "backends/events/kv_event.h"
#include "backends/events/native_events.h"
#include "backends/events/telemetry.h"
#include "hashing/prefix_index.h"
#include "util/result.h"

namespace kvroute::events {

enum class PayloadEncoding : std::uint8_t {
  kAuto,    // by topic: "kvroute.v1..." is native protobuf, anything else vLLM msgpack
  kVllm,
  kNative,
};

struct SubscriberOptions {
  ApplierOptions applier;          // worker id, model namespace, block size, ranks (set from dp_size)
  std::string endpoint;            // publisher of rank 0, e.g. "tcp://10.0.0.7:5557" (connect form, no '*')
  std::string replay_endpoint;     // replay ROUTER of rank 0; empty: gaps always reset
  std::string topic;               // SUB prefix filter; empty: every topic
  std::uint32_t dp_size = 1;       // data-parallel ranks; rank r uses port + r of both endpoints
  PayloadEncoding encoding = PayloadEncoding::kAuto;
  DecodeLimits limits;
  std::chrono::milliseconds replay_timeout{2000};  // silence after which a replay is abandoned
  std::chrono::milliseconds stale_after{0};        // 0: silence never makes a connected stream stale
  std::chrono::milliseconds poll_interval{50};     // bounds stop() latency and liveness checks
  std::chrono::milliseconds heartbeat{1000};       // ZMTP heartbeat; a peer silent 3x this is disconnected
  int receive_hwm = 100'000;                       // messages queued per SUB socket before ZMQ drops
  void* zmq_context = nullptr;                     // shared libzmq context (not owned); null: own one
};

struct SubscriberStatus {
  bool live = false;
  bool connected = false;  // every rank connected
  std::chrono::system_clock::time_point last_message{};  // wall clock of the last message, any rank
  // Wall-clock seconds from the engine stamping the last applied batch (its ts) to its arrival here; none
  // before the first batch with a timestamp. Includes any clock skew between the two hosts.
  std::optional<double> last_batch_lag_s;
  std::uint64_t messages = 0;           // well-formed messages received (live and replayed)
  std::uint64_t batches_applied = 0;
  std::uint64_t events_applied = 0;
  std::uint64_t malformed_frames = 0;   // wrong frame count or sizes, undecodable or oversized payloads
  std::uint64_t gaps = 0;               // sequence gaps seen
  std::uint64_t replays = 0;            // replay requests answered completely
  std::uint64_t replay_failures = 0;    // replays that timed out or did not cover the gap
  std::uint64_t duplicates = 0;         // batches seen twice (replay overlap) and skipped
  std::uint64_t restarts = 0;           // publisher restarts (sequence went backwards)
  std::uint64_t resets = 0;             // times a rank's entries were dropped (restart, lost gap, overflow)
  std::string last_error;               // the most recent malformed-frame or replay message
  ApplierStats applier;
};

class KvEventSubscriber {
 public:
  using LivenessListener = std::function<void(hashing::WorkerId, bool live, std::string_view reason)>;
  using TelemetryListener = std::function<void(hashing::WorkerId, const WorkerTelemetry&)>;

  KvEventSubscriber(hashing::PrefixIndex& index, SubscriberOptions options);
  ~KvEventSubscriber();  // stops
  KvEventSubscriber(const KvEventSubscriber&) = delete;
  KvEventSubscriber& operator=(const KvEventSubscriber&) = delete;

  // Set before start(). Called on the subscriber thread when live() changes / a native LoadReport arrives.
  void set_liveness_listener(LivenessListener l) { liveness_listener_ = std::move(l); }
  void set_telemetry_listener(TelemetryListener l) { telemetry_listener_ = std::move(l); }

  // Validates the endpoints, creates the sockets and starts the thread. Connecting is asynchronous: a
  // publisher that is not up yet is retried by ZMQ until it is.
  Result<Decoded> start();
  void stop();

  bool live() const { return live_.load(std::memory_order_relaxed); }
  SubscriberStatus status() const;
  hashing::WorkerId worker() const { return opt_.applier.worker; }

  // Endpoint of rank `rank` for a base endpoint: "tcp://h:5557", 2 -> "tcp://h:5559". Other transports
  // only have rank 0.
  static Result<std::string> rank_endpoint(std::string_view base, std::uint32_t rank);

 private:
  struct RankState;
  struct Counters {
    std::atomic<std::uint64_t> messages{0}, batches{0}, events{0}, malformed{0}, gaps{0}, replays{0},
        replay_failures{0}, duplicates{0}, restarts{0}, resets{0};
    std::atomic<std::int64_t> last_message_ns{0};
    std::atomic<double> last_batch_lag_s{std::numeric_limits<double>::quiet_NaN()};
  };

  void run();
  // Handles one [topic, seq, payload] from the live stream of `rank`.
  void on_message(std::uint32_t rank, std::string_view topic, std::int64_t seq, std::span<const std::uint8_t> payload);
  // Applies a batch in sequence order (live or replayed): duplicates are skipped, a backwards step is a
  // publisher restart, a forward jump inside a replay resets the rank.
  void apply_in_order(std::uint32_t rank, std::string_view topic, std::int64_t seq,
                      std::span<const std::uint8_t> payload, bool from_replay);
  void decode_and_apply(std::uint32_t rank, std::string_view topic, std::span<const std::uint8_t> payload);
  // Asks the replay socket for batches >= start and applies them; `first_seen` is the first seq received
  // (-1 if none). Returns whether the end marker arrived.
  bool replay(std::uint32_t rank, std::int64_t start, std::int64_t& first_seen);
  void reset_rank(std::uint32_t rank, const char* why);
  void handle_monitor(std::uint32_t rank);
  void update_liveness();
  void note_error(std::string message);
  void publish_snapshot();

  hashing::PrefixIndex& index_;
  SubscriberOptions opt_;
  LivenessListener liveness_listener_;
  TelemetryListener telemetry_listener_;

  // Owned by the subscriber thread (created by start() before the thread exists, destroyed after join).
  void* ctx_ = nullptr;
  bool own_ctx_ = false;
  std::vector<std::unique_ptr<RankState>> ranks_;
  std::unique_ptr<KvEventApplier> applier_;
  KvEventBatch batch_;
  NativeDecoder native_;
  std::vector<std::uint8_t> scratch_;

  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> live_{false};
  bool started_ = false;  // start()/stop() caller only
  Counters counters_;

  mutable std::mutex snapshot_mu_;
  ApplierStats applier_snapshot_;  // guarded by snapshot_mu_
  std::string last_error_;         // guarded by snapshot_mu_
  bool connected_snapshot_ = false;  // guarded by snapshot_mu_
};

}  // namespace kvroute::events
