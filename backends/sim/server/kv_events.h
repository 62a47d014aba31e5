// KV-event publishing for one simulated worker, in vLLM's ZMQ format (docs: architecture section 9) or in
// kvroute's native protobuf stream (proto/kv_events.proto, docs/events.md section 4).
//
// Contract:
//   - PUB socket bound at `endpoint` (e.g. "tcp://*:5557"); every message is three frames
//     [topic, seq (8-byte big-endian, from 0 at process start), payload].
//   - payload is one EventBatch per engine advance that changed the cache, in one of three encodings:
//       positional (vLLM <= 0.23):  [ts, [event...], data_parallel_rank]
//                                   event = ["BlockStored", block_hashes, parent_block_hash, token_ids,
//                                            block_size, lora_id, medium, lora_name(, extra_keys)]
//                                         | ["BlockRemoved", block_hashes, medium] | ["AllBlocksCleared"]
//       map (current vLLM):         {"ts", "events", "data_parallel_rank"}, events as maps with "type";
//                                   fields that have defaults in vLLM (group_idx, kv_cache_spec_*) are left
//                                   out because ours always equal the defaults; extra_keys is sent for a
//                                   salted prompt's first blocks only (cache_salt, as vLLM does).
//       native:                     a serialized kvroute.v1.EventBatch (events::encode_native_batch) with the
//                                   same events, optionally a LoadReport as the last event, and `seq` repeated
//                                   in the payload. The topic must start with "kvroute.v1".
//     msgpack block hashes are the engine's 64-bit hashes written as signed int64 (the same bits; a consumer
//     that wants the unsigned value reinterprets them); native ones are uint64. parent_block_hash is nil
//     (absent) at a root.
//   - Replay: a ROUTER socket at `replay_endpoint`; a DEALER sends [empty, start_seq (8-byte BE)] and gets
//     [empty, seq, payload] for each buffered batch with seq >= start_seq, then [empty, -1 (int64 BE), empty].
//     The buffer keeps the newest `buffer_batches` batches, whatever their encoding.
//
// Threading: publish() is called on the worker's io thread only (it owns the PUB socket). The replay socket
// belongs to a thread of its own; the two share only the batch buffer, under `mu_`.
//
//   KvEventBatch batch(KvEventEncoding::kPositional);
//   batch.stored(hashes, std::nullopt, tokens, 16, "GPU");
//   publisher->publish(batch.encode(ts, 0));
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <atomic>

#include "backends/events/kv_event.h"
#include "backends/events/telemetry.h"
#include "backends/sim/server/internal/msgpack_writer.h"
#include "util/result.h"

namespace kvroute::sim {

enum class KvEventEncoding {
  kPositional,  // vLLM msgpack, events as arrays
  kMap,         // vLLM msgpack, events as maps
  kNative,      // kvroute.v1.EventBatch protobuf
};

// The events of one batch. msgpack encodings are written as events are added; the native one collects an
// events::KvEventBatch and serializes it with the events library's encoder in encode().
class KvEventBatch {
 public:
  explicit KvEventBatch(KvEventEncoding encoding) : encoding_(encoding) {}
  // `lora_name`: the LoRA adapter the blocks were computed under (empty: the base model). `cache_salt`: the
  // salt of the request whose prompt starts at the first block (parent nil); it goes into extra_keys as vLLM
  // sends it: one entry per block, the first (lora_name, cache_salt), the others (lora_name) or nil.
  void stored(std::span<const std::uint64_t> block_hashes, std::optional<std::uint64_t> parent,
              std::span<const std::uint32_t> token_ids, std::uint32_t block_size, std::string_view medium,
              std::string_view lora_name = {}, std::string_view cache_salt = {});
  void removed(std::span<const std::uint64_t> block_hashes, std::string_view medium);
  void cleared();

  bool empty() const { return count_ == 0; }
  std::size_t size() const { return count_; }
  KvEventEncoding encoding() const { return encoding_; }
  // The whole EventBatch; `ts` in seconds since the Unix epoch. `load` and `seq` are written by the native
  // encoding only (vLLM's format has no load event; its seq lives in the frame alone). Not const: the native
  // encoding stamps ts and rank into the collected batch rather than copying it.
  std::string encode(double ts, std::int64_t data_parallel_rank, const events::WorkerTelemetry* load = nullptr,
                     std::optional<std::uint64_t> seq = std::nullopt);
  void clear() {
    events_.clear();
    native_.clear();
    count_ = 0;
  }

 private:
  KvEventEncoding encoding_;
  internal::MsgpackWriter events_;  // msgpack encodings: the encoded events, back to back
  events::KvEventBatch native_;     // native encoding: the events, serialized by encode()
  std::size_t count_ = 0;
};

struct KvEventPublisherConfig {
  std::string endpoint;          // PUB, e.g. "tcp://*:5557"
  std::string replay_endpoint;   // ROUTER, empty = no replay
  std::string topic;             // vLLM's default topic is empty; native topics start with "kvroute.v1"
  std::size_t buffer_batches = 10000;
};

class KvEventPublisher {
 public:
  // Binds both sockets; an error names the endpoint that failed.
  static Result<std::unique_ptr<KvEventPublisher>> open(void* zmq_context, KvEventPublisherConfig config);
  ~KvEventPublisher();
  KvEventPublisher(const KvEventPublisher&) = delete;
  KvEventPublisher& operator=(const KvEventPublisher&) = delete;

  // Sends one batch with the next sequence number and keeps it for replay.
  void publish(std::string payload);
  std::uint64_t next_seq() const { return next_seq_; }

 private:
  KvEventPublisherConfig config_;
  void* pub_ = nullptr;     // io thread only
  void* router_ = nullptr;  // replay thread only (after open())
  std::uint64_t next_seq_ = 0;  // io thread only
  std::atomic<bool> stop_{false};
  std::thread replay_thread_;

  std::mutex mu_;
  std::deque<std::pair<std::uint64_t, std::shared_ptr<const std::string>>> buffer_;  // guarded by mu_

  KvEventPublisher() = default;
  void replay_loop();
};

// 8-byte big-endian encoding of a sequence number (vLLM's frame format).
std::string encode_seq(std::int64_t seq);

}  // namespace kvroute::sim
