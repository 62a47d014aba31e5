// The engine-neutral model of a KV-cache event batch, filled by the vLLM msgpack decoder and by the native
// protobuf decoder, consumed by KvEventApplier.
//
// A batch is flat so that decoding allocates nothing once its vectors have grown: every event refers to a
// range of `block_hashes` and of `token_ids`. Reuse one KvEventBatch per stream (clear() keeps capacity).
//
//   KvEventBatch batch;
//   decode_vllm_batch(payload, limits, batch);
//   for (const KvEvent& e : batch.events) {
//     auto hashes = batch.hashes_of(e);   // engine block hashes of this event
//   }
//
// Engine block hashes are opaque 64-bit keys: an integer hash is kept as its two's-complement bits, a bytes
// hash is reduced with engine_hash_of_bytes() (XXH3-64, seed 0), so a parent given the same way resolves.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvroute::events {

enum class KvEventType : std::uint8_t { kBlockStored, kBlockRemoved, kAllBlocksCleared };

// Where the engine keeps the blocks. vLLM sends "GPU", "CPU" or nil (nil: GPU, the only medium of versions
// that predate the field). Any other medium (a disk tier, say) is kOther and is not applied.
enum class Medium : std::uint8_t { kGpu, kCpu, kOther };

struct KvEvent {
  KvEventType type = KvEventType::kAllBlocksCleared;
  Medium medium = Medium::kGpu;
  bool has_parent = false;             // BlockStored: false when the first block is a root
  std::uint64_t parent_block_hash = 0;  // engine hash, valid when has_parent
  std::uint32_t hashes_begin = 0;       // range in KvEventBatch::block_hashes
  std::uint32_t hashes_count = 0;
  std::uint32_t tokens_begin = 0;       // range in KvEventBatch::token_ids (BlockStored)
  std::uint32_t tokens_count = 0;
  std::uint32_t block_size = 0;         // tokens per engine block (BlockStored)
  std::int64_t group_idx = 0;           // KV cache group (hybrid models); 0 by default
  std::string lora_name;                // empty: the base model
  // BlockStored: the cache_salt in the first block's extra keys (vLLM mixes it into the hash of the block
  // that starts a prompt only); empty: none. The applier roots a salted chain in the salt's namespace.
  std::string cache_salt;
};

struct KvEventBatch {
  double ts = 0;
  std::int64_t data_parallel_rank = -1;  // -1: not given
  std::vector<KvEvent> events;
  std::vector<std::uint64_t> block_hashes;
  std::vector<std::uint32_t> token_ids;
  // Events the decoder skipped (unknown type, unsupported medium); the batch itself was well formed.
  std::uint32_t skipped_events = 0;

  void clear() {
    ts = 0;
    data_parallel_rank = -1;
    events.clear();
    block_hashes.clear();
    token_ids.clear();
    skipped_events = 0;
  }
  // Builders (tests, the simulated worker's publisher). tokens.size() must be hashes.size() x block_size.
  KvEvent& add_stored(std::span<const std::uint64_t> hashes, std::optional<std::uint64_t> parent,
                      std::span<const std::uint32_t> tokens, std::uint32_t block_size, Medium medium = Medium::kGpu,
                      std::string_view lora_name = {}, std::string_view cache_salt = {}) {
    KvEvent& e = add(KvEventType::kBlockStored, hashes, medium);
    e.has_parent = parent.has_value();
    e.parent_block_hash = parent.value_or(0);
    e.tokens_begin = static_cast<std::uint32_t>(token_ids.size());
    e.tokens_count = static_cast<std::uint32_t>(tokens.size());
    token_ids.insert(token_ids.end(), tokens.begin(), tokens.end());
    e.block_size = block_size;
    e.lora_name.assign(lora_name);
    e.cache_salt.assign(cache_salt);
    return e;
  }
  KvEvent& add_removed(std::span<const std::uint64_t> hashes, Medium medium = Medium::kGpu) {
    return add(KvEventType::kBlockRemoved, hashes, medium);
  }
  KvEvent& add_cleared() { return add(KvEventType::kAllBlocksCleared, {}, Medium::kGpu); }

  std::span<const std::uint64_t> hashes_of(const KvEvent& e) const {
    return std::span<const std::uint64_t>(block_hashes).subspan(e.hashes_begin, e.hashes_count);
  }
  std::span<const std::uint32_t> tokens_of(const KvEvent& e) const {
    return std::span<const std::uint32_t>(token_ids).subspan(e.tokens_begin, e.tokens_count);
  }

 private:
  KvEvent& add(KvEventType type, std::span<const std::uint64_t> hashes, Medium medium) {
    KvEvent& e = events.emplace_back();
    e.type = type;
    e.medium = medium;
    e.hashes_begin = static_cast<std::uint32_t>(block_hashes.size());
    e.hashes_count = static_cast<std::uint32_t>(hashes.size());
    block_hashes.insert(block_hashes.end(), hashes.begin(), hashes.end());
    return e;
  }
};

// Bounds on what one frame may contain; anything larger is rejected as malformed before it is stored.
struct DecodeLimits {
  std::size_t max_frame_bytes = 32u << 20;
  std::uint32_t max_events_per_batch = 1u << 16;
  std::uint32_t max_blocks_per_event = 1u << 16;
  std::uint32_t max_tokens_per_event = 1u << 21;
  std::uint32_t max_block_size = 4096;
  int max_depth = 16;
};

// The value of a successful decode (the batch itself is the decoder's out-parameter).
struct Decoded {};

// Deterministic 64-bit key of a bytes-valued engine hash (XXH3-64, seed 0).
std::uint64_t engine_hash_of_bytes(std::span<const std::uint8_t> bytes);

}  // namespace kvroute::events
