#include "backends/events/vllm_events.h"

#include <string>
#include <string_view>

#include "backends/events/msgpack.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace kvroute::events {

std::uint64_t engine_hash_of_bytes(std::span<const std::uint8_t> bytes) {
  return XXH3_64bits_withSeed(bytes.data(), bytes.size(), 0);
}

namespace {

// Fields of one event as read from the wire, before the type is known (map keys come in any order).
struct RawEvent {
  std::string_view type;
  bool has_hashes = false;
  bool has_tokens = false;
  bool has_block_size = false;
  std::vector<std::string_view> first_keys;  // the string members of extra_keys[0], in order
  KvEvent ev;
};

class Decoder {
 public:
  Decoder(std::span<const std::uint8_t> payload, const DecodeLimits& limits, KvEventBatch& out)
      : r_(payload, limits.max_depth), lim_(limits), out_(out) {}

  Result<Decoded> run() {
    decode_batch();
    if (r_.ok() && !r_.at_end()) r_.fail("bytes left after the batch");
    if (!r_.ok()) return make_error("vLLM KV event batch: " + r_.error());
    return Decoded{};
  }

 private:
  bool fail(const std::string& what) { return r_.fail(what); }

  bool decode_batch() {
    if (r_.peek() == MsgType::kArray) {
      std::uint32_t n = 0;
      if (!r_.read_array_header(n)) return false;
      // [ts, events] or [ts, events, data_parallel_rank]; the rank defaults to None and may be omitted.
      if (n < 2 || n > 3) return fail("batch array must have 2 or 3 elements, has " + std::to_string(n));
      if (!r_.read_number(out_.ts)) return false;
      if (!decode_events()) return false;
      if (n == 3) return read_rank();
      return true;
    }
    if (r_.peek() == MsgType::kMap) {
      std::uint32_t n = 0;
      if (!r_.read_map_header(n)) return false;
      bool have_events = false;
      for (std::uint32_t i = 0; i < n; ++i) {
        std::string_view key;
        if (!r_.read_str(key)) return false;
        if (key == "ts") {
          if (!r_.read_number(out_.ts)) return false;
        } else if (key == "events") {
          if (have_events) return fail("duplicate key 'events'");
          if (!decode_events()) return false;
          have_events = true;
        } else if (key == "data_parallel_rank") {
          if (!read_rank()) return false;
        } else if (!r_.skip()) {
          return false;
        }
      }
      // msgspec omits only defaulted keys and `events` has no default.
      if (!have_events) return fail("batch map without 'events'");
      return true;
    }
    return fail(std::string("batch must be an array or a map, found ") + msg_type_name(r_.peek()));
  }

  bool read_rank() {
    if (r_.try_nil()) return true;
    std::int64_t rank = 0;
    if (!r_.read_int(rank)) return false;
    if (rank < 0) return fail("negative data_parallel_rank");
    out_.data_parallel_rank = rank;
    return true;
  }

  bool decode_events() {
    std::uint32_t n = 0;
    if (!r_.read_array_header(n)) return false;
    if (n > lim_.max_events_per_batch) {
      return fail("batch has " + std::to_string(n) + " events, limit " + std::to_string(lim_.max_events_per_batch));
    }
    out_.events.reserve(out_.events.size() + n);
    for (std::uint32_t i = 0; i < n; ++i) {
      const MsgType t = r_.peek();
      if (t == MsgType::kArray) {
        if (!decode_positional_event()) return false;
      } else if (t == MsgType::kMap) {
        if (!decode_map_event()) return false;
      } else {
        return fail(std::string("event must be an array or a map, found ") + msg_type_name(t));
      }
    }
    return true;
  }

  // --- field readers ---------------------------------------------------------------------------------------

  bool read_hash(std::uint64_t& h) {
    const MsgType t = r_.peek();
    if (t == MsgType::kInt) return r_.read_int_bits(h);
    if (t == MsgType::kBin || t == MsgType::kStr) {
      std::span<const std::uint8_t> b;
      if (!r_.read_bytes(b)) return false;
      if (b.empty()) return fail("empty block hash");
      h = engine_hash_of_bytes(b);
      return true;
    }
    return fail(std::string("block hash must be an integer or bytes, found ") + msg_type_name(t));
  }

  bool read_hashes(RawEvent& e) {
    std::uint32_t n = 0;
    if (!r_.read_array_header(n)) return false;
    if (n > lim_.max_blocks_per_event) {
      return fail("event has " + std::to_string(n) + " blocks, limit " + std::to_string(lim_.max_blocks_per_event));
    }
    if (e.has_hashes) return fail("duplicate block_hashes");
    e.has_hashes = true;
    e.ev.hashes_begin = static_cast<std::uint32_t>(out_.block_hashes.size());
    e.ev.hashes_count = n;
    for (std::uint32_t i = 0; i < n; ++i) {
      std::uint64_t h = 0;
      if (!read_hash(h)) return false;
      out_.block_hashes.push_back(h);
    }
    return true;
  }

  bool read_parent(RawEvent& e) {
    if (r_.try_nil()) {
      e.ev.has_parent = false;
      return true;
    }
    e.ev.has_parent = true;
    return read_hash(e.ev.parent_block_hash);
  }

  bool read_tokens(RawEvent& e) {
    std::uint32_t n = 0;
    if (!r_.read_array_header(n)) return false;
    if (n > lim_.max_tokens_per_event) {
      return fail("event has " + std::to_string(n) + " tokens, limit " + std::to_string(lim_.max_tokens_per_event));
    }
    if (e.has_tokens) return fail("duplicate token_ids");
    e.has_tokens = true;
    e.ev.tokens_begin = static_cast<std::uint32_t>(out_.token_ids.size());
    e.ev.tokens_count = n;
    const std::size_t base = out_.token_ids.size();
    out_.token_ids.resize(base + n);
    return r_.read_u32_values(std::span<std::uint32_t>(out_.token_ids.data() + base, n));
  }

  bool read_block_size(RawEvent& e) {
    std::uint64_t bs = 0;
    if (!r_.read_uint(bs)) return false;
    if (bs == 0 || bs > lim_.max_block_size) return fail("block_size " + std::to_string(bs) + " out of range");
    e.ev.block_size = static_cast<std::uint32_t>(bs);
    e.has_block_size = true;
    return true;
  }

  bool read_medium(RawEvent& e) {
    if (r_.try_nil()) {
      e.ev.medium = Medium::kGpu;
      return true;
    }
    std::string_view m;
    if (!r_.read_str(m)) return false;
    if (m == "GPU" || m == "gpu" || m == "cuda") {
      e.ev.medium = Medium::kGpu;
    } else if (m == "CPU" || m == "cpu") {
      e.ev.medium = Medium::kCpu;
    } else {
      e.ev.medium = Medium::kOther;
    }
    return true;
  }

  bool read_lora_name(RawEvent& e) {
    if (r_.try_nil()) return true;
    std::string_view s;
    if (!r_.read_str(s)) return false;
    if (s.size() > 1024) return fail("lora_name longer than 1024 bytes");
    e.ev.lora_name.assign(s);
    return true;
  }

  bool read_nil_or_int() {
    if (r_.try_nil()) return true;
    std::int64_t v = 0;
    return r_.read_int(v);
  }

  bool read_nil_or_str() {
    if (r_.try_nil()) return true;
    std::string_view s;
    return r_.read_str(s);
  }

  bool read_extra_keys(RawEvent& e) {
    // One entry per block, nil or a tuple: vLLM's generate_block_hash_extra_keys (vllm/v1/core/kv_cache_utils.py)
    // puts the LoRA name first, then multimodal keys, then the request's cache_salt on the block that starts
    // the prompt only, then prompt-embedding digests (bytes). Only the first entry's strings are kept.
    if (r_.try_nil()) return true;
    std::uint32_t n = 0;
    if (r_.peek() != MsgType::kArray) return fail("extra_keys must be nil or an array");
    if (!r_.read_array_header(n)) return false;
    for (std::uint32_t i = 0; i < n; ++i) {
      if (i > 0) {
        if (!r_.skip()) return false;
        continue;
      }
      if (r_.try_nil()) continue;
      std::uint32_t k = 0;
      if (r_.peek() != MsgType::kArray) return fail("an extra_keys entry must be nil or an array");
      if (!r_.read_array_header(k)) return false;
      for (std::uint32_t j = 0; j < k; ++j) {
        std::string_view s;
        if (r_.peek() != MsgType::kStr) {
          if (!r_.skip()) return false;
        } else if (!r_.read_str(s)) {
          return false;
        } else if (e.first_keys.size() < 16) {
          e.first_keys.push_back(s);
        }
      }
    }
    return true;
  }

  bool read_group_idx(RawEvent& e) { return r_.read_int(e.ev.group_idx); }

  // --- events ----------------------------------------------------------------------------------------------

  static bool type_of(std::string_view tag, KvEventType& t) {
    if (tag == "BlockStored") {
      t = KvEventType::kBlockStored;
    } else if (tag == "BlockRemoved") {
      t = KvEventType::kBlockRemoved;
    } else if (tag == "AllBlocksCleared") {
      t = KvEventType::kAllBlocksCleared;
    } else {
      return false;
    }
    return true;
  }

  bool decode_positional_event() {
    std::uint32_t n = 0;
    if (!r_.read_array_header(n)) return false;
    if (n == 0) return fail("empty event array");
    RawEvent e;
    if (!r_.read_str(e.type)) return false;
    const std::uint32_t fields = n - 1;
    if (!type_of(e.type, e.ev.type)) {
      for (std::uint32_t i = 0; i < fields; ++i) {
        if (!r_.skip()) return false;
      }
      ++out_.skipped_events;
      return true;
    }
    switch (e.ev.type) {
      case KvEventType::kBlockStored: {
        // The first four fields have no default; lora_id onwards may be absent in older or trimmed events.
        if (fields < 4 || fields > 11) return fail("BlockStored has " + std::to_string(fields) + " fields");
        if (!read_hashes(e) || !read_parent(e) || !read_tokens(e) || !read_block_size(e)) return false;
        if (fields > 4 && !read_nil_or_int()) return false;  // lora_id (deprecated)
        if (fields > 5 && !read_medium(e)) return false;
        if (fields > 6 && !read_lora_name(e)) return false;
        if (fields > 7 && !read_extra_keys(e)) return false;
        if (fields > 8 && !read_group_idx(e)) return false;
        if (fields > 9 && !read_nil_or_str()) return false;  // kv_cache_spec_kind
        if (fields > 10 && !read_nil_or_int()) return false;  // kv_cache_spec_sliding_window
        break;
      }
      case KvEventType::kBlockRemoved:
        if (fields < 1 || fields > 3) return fail("BlockRemoved has " + std::to_string(fields) + " fields");
        if (!read_hashes(e)) return false;
        if (fields > 1 && !read_medium(e)) return false;
        if (fields > 2 && !read_group_idx(e)) return false;
        break;
      case KvEventType::kAllBlocksCleared:
        if (fields != 0) return fail("AllBlocksCleared has fields");
        break;
    }
    return finish(e);
  }

  bool decode_map_event() {
    std::uint32_t n = 0;
    if (!r_.read_map_header(n)) return false;
    RawEvent e;
    bool have_type = false;
    const std::size_t hashes_mark = out_.block_hashes.size();
    const std::size_t tokens_mark = out_.token_ids.size();
    for (std::uint32_t i = 0; i < n; ++i) {
      std::string_view key;
      if (!r_.read_str(key)) return false;
      bool okv = true;
      if (key == "type") {
        okv = r_.read_str(e.type);
        have_type = true;
      } else if (key == "block_hashes") {
        okv = read_hashes(e);
      } else if (key == "parent_block_hash") {
        okv = read_parent(e);
      } else if (key == "token_ids") {
        okv = read_tokens(e);
      } else if (key == "block_size") {
        okv = read_block_size(e);
      } else if (key == "medium") {
        okv = read_medium(e);
      } else if (key == "lora_name") {
        okv = read_lora_name(e);
      } else if (key == "lora_id" || key == "kv_cache_spec_sliding_window") {
        okv = read_nil_or_int();
      } else if (key == "kv_cache_spec_kind") {
        okv = read_nil_or_str();
      } else if (key == "extra_keys") {
        okv = read_extra_keys(e);
      } else if (key == "group_idx") {
        okv = read_group_idx(e);
      } else {
        okv = r_.skip();  // a field from a newer engine
      }
      if (!okv) return false;
    }
    if (!have_type) return fail("event map without 'type'");
    if (!type_of(e.type, e.ev.type)) {
      out_.block_hashes.resize(hashes_mark);
      out_.token_ids.resize(tokens_mark);
      ++out_.skipped_events;
      return true;
    }
    switch (e.ev.type) {
      case KvEventType::kBlockStored:
        if (!e.has_hashes || !e.has_tokens || !e.has_block_size) {
          return fail("BlockStored without block_hashes, token_ids or block_size");
        }
        break;
      case KvEventType::kBlockRemoved:
        if (!e.has_hashes) return fail("BlockRemoved without block_hashes");
        if (e.has_tokens) return fail("BlockRemoved with token_ids");
        break;
      case KvEventType::kAllBlocksCleared:
        if (e.has_hashes || e.has_tokens) return fail("AllBlocksCleared with fields");
        break;
    }
    return finish(e);
  }

  bool finish(RawEvent& e) {
    if (e.ev.type == KvEventType::kBlockStored &&
        static_cast<std::uint64_t>(e.ev.hashes_count) * e.ev.block_size != e.ev.tokens_count) {
      return fail("BlockStored has " + std::to_string(e.ev.tokens_count) + " token ids for " +
                  std::to_string(e.ev.hashes_count) + " blocks of " + std::to_string(e.ev.block_size));
    }
    if (e.ev.type == KvEventType::kBlockStored && !e.first_keys.empty()) {
      // The salt is the last string after the LoRA name (multimodal keys of current vLLM are tuples).
      auto keys = std::span(e.first_keys);
      if (!e.ev.lora_name.empty() && keys.front() == e.ev.lora_name) keys = keys.subspan(1);
      if (!keys.empty()) {
        if (keys.back().size() > 1024) return fail("cache_salt longer than 1024 bytes");
        e.ev.cache_salt.assign(keys.back());
      }
    }
    out_.events.push_back(std::move(e.ev));
    return true;
  }

  MsgpackReader r_;
  const DecodeLimits& lim_;
  KvEventBatch& out_;
};

}  // namespace

Result<Decoded> decode_vllm_batch(std::span<const std::uint8_t> payload, const DecodeLimits& limits,
                                  KvEventBatch& out) {
  out.clear();
  if (payload.size() > limits.max_frame_bytes) {
    return make_error("vLLM KV event batch: " + std::to_string(payload.size()) + " bytes exceeds the limit of " +
                      std::to_string(limits.max_frame_bytes));
  }
  return Decoder(payload, limits, out).run();
}

}  // namespace kvroute::events

namespace kvroute::events {

namespace {

void write_medium(MsgpackWriter& w, Medium m) {
  if (m == Medium::kCpu) {
    w.str("CPU");
  } else {
    w.str("GPU");
  }
}

void write_hashes(MsgpackWriter& w, std::span<const std::uint64_t> hs) {
  w.array(static_cast<std::uint32_t>(hs.size()));
  for (std::uint64_t h : hs) w.u64(h);
}

void write_tokens(MsgpackWriter& w, std::span<const std::uint32_t> ts) {
  w.array(static_cast<std::uint32_t>(ts.size()));
  for (std::uint32_t t : ts) w.u64(t);
}

// extra_keys as vLLM fills them for a salted prompt: one entry per block, (lora_name, cache_salt) for the
// first, (lora_name) or nil for the others.
void write_extra_keys(MsgpackWriter& w, const KvEvent& e) {
  w.array(e.hashes_count);
  for (std::uint32_t i = 0; i < e.hashes_count; ++i) {
    const std::uint32_t n = (e.lora_name.empty() ? 0 : 1) + (i == 0 ? 1 : 0);
    if (n == 0) {
      w.nil();
      continue;
    }
    w.array(n);
    if (!e.lora_name.empty()) w.str(e.lora_name);
    if (i == 0) w.str(e.cache_salt);
  }
}

void write_positional(MsgpackWriter& w, const KvEventBatch& b, const KvEvent& e) {
  switch (e.type) {
    case KvEventType::kBlockStored: {
      // Fields after lora_name are left out when they equal their defaults, as msgspec does.
      const bool group = e.group_idx != 0;
      const bool salted = !e.cache_salt.empty();
      w.array(group ? 10 : salted ? 9 : 8).str("BlockStored");
      write_hashes(w, b.hashes_of(e));
      if (e.has_parent) w.u64(e.parent_block_hash); else w.nil();
      write_tokens(w, b.tokens_of(e));
      w.u64(e.block_size).nil();
      write_medium(w, e.medium);
      if (e.lora_name.empty()) w.nil(); else w.str(e.lora_name);
      if (salted) write_extra_keys(w, e); else if (group) w.nil();
      if (group) w.i64(e.group_idx);
      break;
    }
    case KvEventType::kBlockRemoved: {
      const bool group = e.group_idx != 0;
      w.array(group ? 4 : 3).str("BlockRemoved");
      write_hashes(w, b.hashes_of(e));
      write_medium(w, e.medium);
      if (group) w.i64(e.group_idx);
      break;
    }
    case KvEventType::kAllBlocksCleared:
      w.array(1).str("AllBlocksCleared");
      break;
  }
}

// Map form. With omit_defaults (shape 3) keys with default values are dropped; shape 2 keeps them all.
void write_map(MsgpackWriter& w, const KvEventBatch& b, const KvEvent& e, bool omit_defaults) {
  switch (e.type) {
    case KvEventType::kBlockStored: {
      const bool lora = !e.lora_name.empty() || !omit_defaults;
      const bool group = e.group_idx != 0 || !omit_defaults;
      const bool salted = !e.cache_salt.empty();
      w.map(7 + (lora ? 1 : 0) + (group ? 1 : 0) + (salted ? 1 : 0));
      w.str("type").str("BlockStored");
      w.str("block_hashes");
      write_hashes(w, b.hashes_of(e));
      w.str("parent_block_hash");
      if (e.has_parent) w.u64(e.parent_block_hash); else w.nil();
      w.str("token_ids");
      write_tokens(w, b.tokens_of(e));
      w.str("block_size").u64(e.block_size);
      w.str("lora_id").nil();
      w.str("medium");
      write_medium(w, e.medium);
      if (lora) {
        w.str("lora_name");
        if (e.lora_name.empty()) w.nil(); else w.str(e.lora_name);
      }
      if (salted) write_extra_keys(w.str("extra_keys"), e);
      if (group) w.str("group_idx").i64(e.group_idx);
      break;
    }
    case KvEventType::kBlockRemoved: {
      const bool group = e.group_idx != 0 || !omit_defaults;
      w.map(3 + (group ? 1 : 0));
      w.str("type").str("BlockRemoved");
      w.str("block_hashes");
      write_hashes(w, b.hashes_of(e));
      w.str("medium");
      write_medium(w, e.medium);
      if (group) w.str("group_idx").i64(e.group_idx);
      break;
    }
    case KvEventType::kAllBlocksCleared:
      w.map(1).str("type").str("AllBlocksCleared");
      break;
  }
}

}  // namespace

std::vector<std::uint8_t> encode_vllm_batch(const KvEventBatch& batch, VllmShape shape) {
  MsgpackWriter w;
  const bool has_rank = batch.data_parallel_rank >= 0;
  if (shape == VllmShape::kMapMapEvents) {
    w.map(has_rank ? 3 : 2).str("ts").f64(batch.ts).str("events");
  } else {
    w.array(has_rank ? 3 : 2).f64(batch.ts);
  }
  w.array(static_cast<std::uint32_t>(batch.events.size()));
  for (const KvEvent& e : batch.events) {
    if (shape == VllmShape::kArrayPositional) {
      write_positional(w, batch, e);
    } else {
      write_map(w, batch, e, shape == VllmShape::kMapMapEvents);
    }
  }
  if (has_rank) {
    if (shape == VllmShape::kMapMapEvents) w.str("data_parallel_rank");
    w.i64(batch.data_parallel_rank);
  }
  return w.take();
}

}  // namespace kvroute::events
