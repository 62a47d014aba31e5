// Decoder and encoder of kvroute's native KV-event stream (proto/kv_events.proto, docs/events.md).
//
// The payload is one serialized kvroute.v1.EventBatch. Stored / removed / cleared events decode into the same
// KvEventBatch as vLLM's msgpack, so one KvEventApplier serves both; LoadReport events decode into a
// WorkerTelemetry (the last one of the batch wins).
//
//   NativeDecoder dec;
//   KvEventBatch batch;
//   std::optional<WorkerTelemetry> load;
//   if (auto st = dec.decode(payload, DecodeLimits{}, batch, load); !st) ++malformed;
//
// Thread safety: a NativeDecoder reuses one message between calls; use one per thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "backends/events/kv_event.h"
#include "backends/events/telemetry.h"
#include "util/result.h"

namespace kvroute::v1 {
class EventBatch;
}

namespace kvroute::events {


// Topics of native publishers start with this; the subscriber picks the decoder by it.
inline constexpr std::string_view kNativeTopicPrefix = "kvroute.v1";

class NativeDecoder {
 public:
  NativeDecoder();
  ~NativeDecoder();
  NativeDecoder(const NativeDecoder&) = delete;
  NativeDecoder& operator=(const NativeDecoder&) = delete;

  Result<Decoded> decode(std::span<const std::uint8_t> payload, const DecodeLimits& limits, KvEventBatch& out,
                         std::optional<WorkerTelemetry>& load);

 private:
  std::unique_ptr<v1::EventBatch> msg_;
};

// Serializes a batch (and an optional load report, appended as the last event) as a native payload.
std::string encode_native_batch(const KvEventBatch& batch, const WorkerTelemetry* load = nullptr,
                                std::optional<std::uint64_t> seq = std::nullopt);

}  // namespace kvroute::events
