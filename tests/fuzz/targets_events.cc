#include "tests/fuzz/targets.h"

#include <array>
#include <optional>
#include <string_view>

#include "backends/events/event_applier.h"
#include "backends/events/metrics_parse.h"
#include "backends/events/native_events.h"
#include "backends/events/vllm_events.h"

namespace kvroute::fuzz {

namespace {

std::string_view text(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// Decoded batches are applied too: the applier must cope with whatever a decoder accepts.
void apply(const events::KvEventBatch& batch) {
  hashing::PrefixIndex index;
  events::KvEventApplier applier(index, events::applier_options(0, "m", 2, 1024));
  applier.apply(batch, 0);
  applier.apply(batch, 1);
  applier.apply(batch, 0);
}

void run_vllm_events(const std::uint8_t* data, std::size_t size) {
  events::KvEventBatch batch;
  if (events::decode_vllm_batch(std::span(data, size), events::DecodeLimits{}, batch)) apply(batch);
}

void run_native_events(const std::uint8_t* data, std::size_t size) {
  events::NativeDecoder decoder;
  events::KvEventBatch batch;
  std::optional<events::WorkerTelemetry> load;
  if (decoder.decode(std::span(data, size), events::DecodeLimits{}, batch, load)) apply(batch);
}

void run_metrics(const std::uint8_t* data, std::size_t size) {
  const auto parsed = events::parse_prometheus_text(text(data, size));
  (void)events::extract_telemetry(parsed);
  (void)events::parse_worker_telemetry(text(data, size));
}

constexpr std::array<FuzzTarget, 3> kTargets = {{
    {"vllm_events", run_vllm_events},
    {"native_events", run_native_events},
    {"metrics", run_metrics},
}};

}  // namespace

std::span<const FuzzTarget> event_fuzz_targets() { return kTargets; }

}  // namespace kvroute::fuzz
