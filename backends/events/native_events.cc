#include "backends/events/native_events.h"

#include "proto/kv_events.pb.h"

namespace kvroute::events {

namespace {

Medium medium_of(v1::Medium m) {
  switch (m) {
    case v1::MEDIUM_GPU: return Medium::kGpu;
    case v1::MEDIUM_CPU: return Medium::kCpu;
    default: return Medium::kOther;  // a value from a newer schema
  }
}

v1::Medium medium_to(Medium m) { return m == Medium::kCpu ? v1::MEDIUM_CPU : v1::MEDIUM_GPU; }

}  // namespace

NativeDecoder::NativeDecoder() : msg_(std::make_unique<v1::EventBatch>()) {}
NativeDecoder::~NativeDecoder() = default;

Result<Decoded> NativeDecoder::decode(std::span<const std::uint8_t> payload, const DecodeLimits& limits,
                                      KvEventBatch& out, std::optional<WorkerTelemetry>& load) {
  out.clear();
  load.reset();
  auto fail = [](const std::string& m) { return make_error("native KV event batch: " + m); };
  if (payload.size() > limits.max_frame_bytes) {
    return fail(std::to_string(payload.size()) + " bytes exceeds the limit of " +
                std::to_string(limits.max_frame_bytes));
  }
  // max_frame_bytes (<= 2 GiB) bounds what the parser may allocate.
  if (!msg_->ParseFromArray(payload.data(), static_cast<int>(payload.size()))) return fail("not a valid EventBatch");
  const v1::EventBatch& m = *msg_;
  if (static_cast<std::uint64_t>(m.events_size()) > limits.max_events_per_batch) {
    return fail("too many events (" + std::to_string(m.events_size()) + ")");
  }
  out.ts = m.ts();
  if (m.has_data_parallel_rank()) {
    if (m.data_parallel_rank() < 0) return fail("negative data_parallel_rank");
    out.data_parallel_rank = m.data_parallel_rank();
  }
  for (const v1::Event& ev : m.events()) {
    KvEvent e;
    switch (ev.kind_case()) {
      case v1::Event::kStored: {
        const v1::BlockStored& s = ev.stored();
        if (static_cast<std::uint64_t>(s.block_hashes_size()) > limits.max_blocks_per_event) {
          return fail("BlockStored has too many blocks");
        }
        if (static_cast<std::uint64_t>(s.token_ids_size()) > limits.max_tokens_per_event) {
          return fail("BlockStored has too many tokens");
        }
        if (s.block_size() == 0 || s.block_size() > limits.max_block_size) {
          return fail("block_size " + std::to_string(s.block_size()) + " out of range");
        }
        if (static_cast<std::uint64_t>(s.block_hashes_size()) * s.block_size() !=
            static_cast<std::uint64_t>(s.token_ids_size())) {
          return fail("BlockStored token_ids do not cover block_hashes x block_size");
        }
        e.type = KvEventType::kBlockStored;
        e.has_parent = s.has_parent_block_hash();
        e.parent_block_hash = s.parent_block_hash();
        e.block_size = s.block_size();
        e.medium = medium_of(s.medium());
        e.lora_name = s.lora_name();
        e.cache_salt = s.cache_salt();
        e.group_idx = s.group_idx();
        e.hashes_begin = static_cast<std::uint32_t>(out.block_hashes.size());
        e.hashes_count = static_cast<std::uint32_t>(s.block_hashes_size());
        out.block_hashes.insert(out.block_hashes.end(), s.block_hashes().begin(), s.block_hashes().end());
        e.tokens_begin = static_cast<std::uint32_t>(out.token_ids.size());
        e.tokens_count = static_cast<std::uint32_t>(s.token_ids_size());
        out.token_ids.insert(out.token_ids.end(), s.token_ids().begin(), s.token_ids().end());
        break;
      }
      case v1::Event::kRemoved: {
        const v1::BlockRemoved& r = ev.removed();
        if (static_cast<std::uint64_t>(r.block_hashes_size()) > limits.max_blocks_per_event) {
          return fail("BlockRemoved has too many blocks");
        }
        e.type = KvEventType::kBlockRemoved;
        e.medium = medium_of(r.medium());
        e.group_idx = r.group_idx();
        e.hashes_begin = static_cast<std::uint32_t>(out.block_hashes.size());
        e.hashes_count = static_cast<std::uint32_t>(r.block_hashes_size());
        out.block_hashes.insert(out.block_hashes.end(), r.block_hashes().begin(), r.block_hashes().end());
        break;
      }
      case v1::Event::kCleared:
        e.type = KvEventType::kAllBlocksCleared;
        break;
      case v1::Event::kLoad: {
        const v1::LoadReport& l = ev.load();
        WorkerTelemetry t;
        t.engine = EngineKind::kNative;
        t.running = l.running();
        t.waiting = l.waiting();
        t.kv_usage = l.kv_usage();
        if (l.num_gpu_blocks() != 0) t.num_gpu_blocks = l.num_gpu_blocks();
        if (l.num_cpu_blocks() != 0) t.num_cpu_blocks = l.num_cpu_blocks();
        if (l.block_size() != 0) t.block_size = l.block_size();
        if (l.prefix_cache_queries() != 0) {
          t.prefix_cache_queries = static_cast<double>(l.prefix_cache_queries());
          t.prefix_cache_hits = static_cast<double>(l.prefix_cache_hits());
        }
        load = t;
        continue;
      }
      case v1::Event::KIND_NOT_SET:
        // An event kind from a newer schema: skipped, like vLLM's unknown types.
        ++out.skipped_events;
        continue;
    }
    out.events.push_back(std::move(e));
  }
  return Decoded{};
}

std::string encode_native_batch(const KvEventBatch& batch, const WorkerTelemetry* load,
                                std::optional<std::uint64_t> seq) {
  v1::EventBatch m;
  m.set_ts(batch.ts);
  if (batch.data_parallel_rank >= 0) m.set_data_parallel_rank(static_cast<std::int32_t>(batch.data_parallel_rank));
  if (seq) m.set_seq(*seq);
  for (const KvEvent& e : batch.events) {
    v1::Event* ev = m.add_events();
    switch (e.type) {
      case KvEventType::kBlockStored: {
        v1::BlockStored* s = ev->mutable_stored();
        for (std::uint64_t h : batch.hashes_of(e)) s->add_block_hashes(h);
        if (e.has_parent) s->set_parent_block_hash(e.parent_block_hash);
        for (std::uint32_t t : batch.tokens_of(e)) s->add_token_ids(t);
        s->set_block_size(e.block_size);
        s->set_medium(medium_to(e.medium));
        s->set_lora_name(e.lora_name);
        s->set_group_idx(e.group_idx);
        if (!e.cache_salt.empty()) s->set_cache_salt(e.cache_salt);
        break;
      }
      case KvEventType::kBlockRemoved: {
        v1::BlockRemoved* r = ev->mutable_removed();
        for (std::uint64_t h : batch.hashes_of(e)) r->add_block_hashes(h);
        r->set_medium(medium_to(e.medium));
        r->set_group_idx(e.group_idx);
        break;
      }
      case KvEventType::kAllBlocksCleared:
        ev->mutable_cleared();
        break;
    }
  }
  if (load != nullptr) {
    v1::LoadReport* l = m.add_events()->mutable_load();
    l->set_running(static_cast<std::uint32_t>(load->running.value_or(0)));
    l->set_waiting(static_cast<std::uint32_t>(load->waiting.value_or(0)));
    l->set_kv_usage(load->kv_usage.value_or(0));
    l->set_num_gpu_blocks(load->num_gpu_blocks.value_or(0));
    l->set_num_cpu_blocks(load->num_cpu_blocks.value_or(0));
    l->set_block_size(load->block_size.value_or(0));
    l->set_prefix_cache_queries(static_cast<std::uint64_t>(load->prefix_cache_queries.value_or(0)));
    l->set_prefix_cache_hits(static_cast<std::uint64_t>(load->prefix_cache_hits.value_or(0)));
  }
  return m.SerializeAsString();
}

}  // namespace kvroute::events
