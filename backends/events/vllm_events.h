// Decoder (and, for tests and the simulated worker, encoder) of vLLM's KV-event batches (msgspec msgpack), all three shapes of architecture section 9:
//
//  1. array batch, positional events (vLLM <= 0.23):
//       [ts, [["BlockStored", hashes, parent, token_ids, block_size, lora_id, medium, lora_name, ...], ...], dp]
//     trailing fields equal to their defaults may be absent, so events and the batch may be shorter;
//  2. array batch, map events (vLLM 0.26 as observed):   [ts, [{"type": "BlockStored", ...}, ...], dp]
//  3. map batch, map events (current vLLM source):        {"ts":..., "events":[{"type":...}], "data_parallel_rank":...}
//     keys whose value equals the default are absent.
//
// Field order of the positional form (vLLM's vllm/distributed/kv_events.py declaration order):
//   BlockStored:  block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name,
//                 extra_keys, group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window
//   BlockRemoved: block_hashes, medium, group_idx
//   AllBlocksCleared: (none)
// Older releases end BlockStored after lora_id and BlockRemoved after block_hashes; both are accepted.
//
// Strictness: a wrong type, a size beyond DecodeLimits, token_ids whose count is not
// block_hashes x block_size, or bytes left after the batch make the whole frame an error (the caller counts
// it and skips the frame). Unknown map keys are ignored and an unknown event type is skipped and counted in
// batch.skipped_events, so newer engines that add fields or event kinds still decode.
//
//   KvEventBatch batch;
//   if (auto st = decode_vllm_batch(payload, DecodeLimits{}, batch); !st) ++malformed;  // st.error().message
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backends/events/kv_event.h"
#include "util/result.h"

namespace kvroute::events {


// Decodes `payload` into `out` (cleared first). On error `out` is left in an unspecified state.
Result<Decoded> decode_vllm_batch(std::span<const std::uint8_t> payload, const DecodeLimits& limits,
                                  KvEventBatch& out);

// The three shapes above, for encode_vllm_batch().
enum class VllmShape : std::uint8_t {
  kArrayPositional,  // shape 1: trailing default fields omitted
  kArrayMapEvents,   // shape 2
  kMapMapEvents,     // shape 3: default-valued keys omitted
};

// Encodes a batch the way vLLM's msgspec encoder would (tests, the simulated worker's publisher).
// Hashes are written as unsigned integers.
std::vector<std::uint8_t> encode_vllm_batch(const KvEventBatch& batch, VllmShape shape);

}  // namespace kvroute::events
