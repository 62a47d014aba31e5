#include "backends/sim/server/kv_events.h"

#include <cerrno>
#include <cstring>

#include <vector>

#include <zmq.h>

#include "backends/events/native_events.h"

namespace kvroute::sim {

namespace {

void hashes(internal::MsgpackWriter& w, std::span<const std::uint64_t> block_hashes) {
  w.array(block_hashes.size());
  // vLLM's ExternalBlockHash is a Python int that msgspec writes as a signed 64-bit integer.
  for (std::uint64_t h : block_hashes) w.i64(static_cast<std::int64_t>(h));
}

// The engine names its media "GPU" and "CPU" (vLLM's strings); the native schema has an enum.
events::Medium native_medium(std::string_view medium) {
  return medium == "CPU" ? events::Medium::kCpu : events::Medium::kGpu;
}

}  // namespace

void KvEventBatch::stored(std::span<const std::uint64_t> block_hashes, std::optional<std::uint64_t> parent,
                          std::span<const std::uint32_t> token_ids, std::uint32_t block_size,
                          std::string_view medium, std::string_view lora_name, std::string_view cache_salt) {
  const bool salted = !cache_salt.empty() && !parent;
  if (encoding_ == KvEventEncoding::kNative) {
    native_.add_stored(block_hashes, parent, token_ids, block_size, native_medium(medium), lora_name,
                       salted ? cache_salt : std::string_view());
    ++count_;
    return;
  }
  auto& w = events_;
  const bool map = encoding_ == KvEventEncoding::kMap;
  if (map) {
    w.map(salted ? 9 : 8);
    w.str("type");
  } else {
    w.array(salted ? 9 : 8);
  }
  w.str("BlockStored");
  if (map) w.str("block_hashes");
  hashes(w, block_hashes);
  if (map) w.str("parent_block_hash");
  if (parent) w.i64(static_cast<std::int64_t>(*parent));
  else w.nil();
  if (map) w.str("token_ids");
  w.array(token_ids.size());
  for (std::uint32_t t : token_ids) w.u64(t);
  if (map) w.str("block_size");
  w.u64(block_size);
  if (map) w.str("lora_id");
  w.nil();
  if (map) w.str("medium");
  w.str(medium);
  if (map) w.str("lora_name");
  if (lora_name.empty()) w.nil();
  else w.str(lora_name);
  if (salted) {
    // vllm/v1/core/kv_cache_utils.py generate_block_hash_extra_keys: LoRA keys, then cache_salt on block 0.
    if (map) w.str("extra_keys");
    w.array(block_hashes.size());
    for (std::size_t b = 0; b < block_hashes.size(); ++b) {
      const std::size_t n = (lora_name.empty() ? 0 : 1) + (b == 0 ? 1 : 0);
      if (n == 0) {
        w.nil();
        continue;
      }
      w.array(n);
      if (!lora_name.empty()) w.str(lora_name);
      if (b == 0) w.str(cache_salt);
    }
  }
  ++count_;
}

void KvEventBatch::removed(std::span<const std::uint64_t> block_hashes, std::string_view medium) {
  if (encoding_ == KvEventEncoding::kNative) {
    native_.add_removed(block_hashes, native_medium(medium));
    ++count_;
    return;
  }
  auto& w = events_;
  const bool map = encoding_ == KvEventEncoding::kMap;
  if (map) {
    w.map(3);
    w.str("type");
  } else {
    w.array(3);
  }
  w.str("BlockRemoved");
  if (map) w.str("block_hashes");
  hashes(w, block_hashes);
  if (map) w.str("medium");
  w.str(medium);
  ++count_;
}

void KvEventBatch::cleared() {
  if (encoding_ == KvEventEncoding::kNative) {
    native_.add_cleared();
    ++count_;
    return;
  }
  auto& w = events_;
  if (encoding_ == KvEventEncoding::kMap) {
    w.map(1);
    w.str("type");
  } else {
    w.array(1);
  }
  w.str("AllBlocksCleared");
  ++count_;
}

std::string KvEventBatch::encode(double ts, std::int64_t data_parallel_rank, const events::WorkerTelemetry* load,
                                 std::optional<std::uint64_t> seq) {
  if (encoding_ == KvEventEncoding::kNative) {
    native_.ts = ts;
    native_.data_parallel_rank = data_parallel_rank;
    return events::encode_native_batch(native_, load, seq);
  }
  internal::MsgpackWriter w;
  const bool map = encoding_ == KvEventEncoding::kMap;
  if (map) {
    w.map(3);
    w.str("ts");
  } else {
    w.array(3);
  }
  w.f64(ts);
  if (map) w.str("events");
  w.array(count_);
  w.raw(events_.data());
  if (map) w.str("data_parallel_rank");
  w.i64(data_parallel_rank);
  return w.take();
}

std::string encode_seq(std::int64_t seq) {
  std::string out(8, '\0');
  const auto u = static_cast<std::uint64_t>(seq);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(u >> (8 * (7 - i)));
  return out;
}

Result<std::unique_ptr<KvEventPublisher>> KvEventPublisher::open(void* zmq_context, KvEventPublisherConfig config) {
  std::unique_ptr<KvEventPublisher> p(new KvEventPublisher());
  p->config_ = std::move(config);
  p->pub_ = zmq_socket(zmq_context, ZMQ_PUB);
  int linger = 0;
  // A subscriber that never reads must not grow our memory without bound: drop beyond the HWM, as vLLM does.
  int hwm = 100000;
  zmq_setsockopt(p->pub_, ZMQ_LINGER, &linger, sizeof linger);
  zmq_setsockopt(p->pub_, ZMQ_SNDHWM, &hwm, sizeof hwm);
  if (zmq_bind(p->pub_, p->config_.endpoint.c_str()) != 0) {
    return make_error("kv events: cannot bind PUB socket at '" + p->config_.endpoint + "': " + zmq_strerror(errno),
                      500, "server_error");
  }
  if (!p->config_.replay_endpoint.empty()) {
    p->router_ = zmq_socket(zmq_context, ZMQ_ROUTER);
    zmq_setsockopt(p->router_, ZMQ_LINGER, &linger, sizeof linger);
    if (zmq_bind(p->router_, p->config_.replay_endpoint.c_str()) != 0) {
      return make_error("kv events: cannot bind replay ROUTER socket at '" + p->config_.replay_endpoint +
                            "': " + zmq_strerror(errno),
                        500, "server_error");
    }
    p->replay_thread_ = std::thread([raw = p.get()] { raw->replay_loop(); });
  }
  return p;
}

KvEventPublisher::~KvEventPublisher() {
  stop_ = true;
  if (replay_thread_.joinable()) replay_thread_.join();
  if (router_ != nullptr) zmq_close(router_);
  if (pub_ != nullptr) zmq_close(pub_);
}

void KvEventPublisher::publish(std::string payload) {
  const std::uint64_t seq = next_seq_++;
  auto shared = std::make_shared<const std::string>(std::move(payload));
  const std::string seq_bytes = encode_seq(static_cast<std::int64_t>(seq));
  // ZMQ_DONTWAIT: a PUB socket never blocks anyway, but be explicit that the io thread must not stall.
  zmq_send(pub_, config_.topic.data(), config_.topic.size(), ZMQ_SNDMORE | ZMQ_DONTWAIT);
  zmq_send(pub_, seq_bytes.data(), seq_bytes.size(), ZMQ_SNDMORE | ZMQ_DONTWAIT);
  zmq_send(pub_, shared->data(), shared->size(), ZMQ_DONTWAIT);
  if (router_ == nullptr) return;
  std::lock_guard lock(mu_);
  buffer_.emplace_back(seq, std::move(shared));
  while (buffer_.size() > config_.buffer_batches) buffer_.pop_front();
}

void KvEventPublisher::replay_loop() {
  // Poll with a timeout so that the destructor's stop_ is seen within 100 ms.
  while (!stop_) {
    zmq_pollitem_t item{router_, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&item, 1, 100) <= 0 || (item.revents & ZMQ_POLLIN) == 0) continue;
    // A request is [identity, empty, start_seq]; anything else is drained and ignored.
    std::string frames[4];
    int n = 0;
    int more = 1;
    while (more) {
      zmq_msg_t msg;
      zmq_msg_init(&msg);
      if (zmq_msg_recv(&msg, router_, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&msg);
        break;
      }
      if (n < 4) frames[n].assign(static_cast<const char*>(zmq_msg_data(&msg)), zmq_msg_size(&msg));
      ++n;
      more = zmq_msg_more(&msg);
      zmq_msg_close(&msg);
    }
    if (n != 3 || frames[2].size() != 8) continue;
    std::uint64_t start = 0;
    for (unsigned char c : frames[2]) start = (start << 8) | c;
    // Copy the matching batches under the lock, send outside it.
    std::vector<std::pair<std::uint64_t, std::shared_ptr<const std::string>>> todo;
    {
      std::lock_guard lock(mu_);
      for (const auto& e : buffer_) {
        if (e.first >= start) todo.push_back(e);
      }
    }
    const std::string& id = frames[0];
    for (const auto& [seq, payload] : todo) {
      const std::string s = encode_seq(static_cast<std::int64_t>(seq));
      zmq_send(router_, id.data(), id.size(), ZMQ_SNDMORE);
      zmq_send(router_, "", 0, ZMQ_SNDMORE);
      zmq_send(router_, s.data(), s.size(), ZMQ_SNDMORE);
      zmq_send(router_, payload->data(), payload->size(), 0);
    }
    const std::string end = encode_seq(-1);
    zmq_send(router_, id.data(), id.size(), ZMQ_SNDMORE);
    zmq_send(router_, "", 0, ZMQ_SNDMORE);
    zmq_send(router_, end.data(), end.size(), ZMQ_SNDMORE);
    zmq_send(router_, "", 0, 0);
  }
}

}  // namespace kvroute::sim
