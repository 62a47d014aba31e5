#include "backends/events/kv_event_subscriber.h"

#include <zmq.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <cmath>
#include <limits>

#include "backends/events/vllm_events.h"

namespace kvroute::events {

namespace {

constexpr std::int64_t kNoFloor = std::numeric_limits<std::int64_t>::max();
// Live messages handled per socket per poll round, so one busy rank cannot starve the others.
constexpr int kMaxDrainPerRound = 1024;

std::int64_t load_be64(const std::uint8_t* p) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | p[i];
  return static_cast<std::int64_t>(v);
}

void store_be64(std::int64_t s, std::uint8_t* p) {
  const auto v = static_cast<std::uint64_t>(s);
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::uint8_t>(v >> (56 - 8 * i));
}

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// One multipart message, received whole (ZMQ delivers all parts of a message or none).
class Frames {
 public:
  static constexpr int kMax = 4;
  Frames() = default;
  Frames(const Frames&) = delete;
  Frames& operator=(const Frames&) = delete;
  ~Frames() { release(); }

  // Receives the next message; false if none is waiting (with ZMQ_DONTWAIT) or on error.
  bool recv(void* socket, int flags) {
    release();
    while (true) {
      zmq_msg_t m;
      zmq_msg_init(&m);
      if (zmq_msg_recv(&m, socket, n_ == 0 && parts_ == 0 ? flags : 0) < 0) {
        zmq_msg_close(&m);
        return parts_ > 0;
      }
      const bool more = zmq_msg_more(&m) != 0;
      if (n_ < kMax) {
        msg_[n_++] = m;
      } else {
        zmq_msg_close(&m);  // extra parts are counted, not kept
      }
      ++parts_;
      if (!more) return true;
    }
  }
  int parts() const { return parts_; }
  std::span<const std::uint8_t> bytes(int i) {
    return {static_cast<const std::uint8_t*>(zmq_msg_data(&msg_[i])), zmq_msg_size(&msg_[i])};
  }
  std::string_view text(int i) {
    auto b = bytes(i);
    return {reinterpret_cast<const char*>(b.data()), b.size()};
  }

 private:
  void release() {
    for (int i = 0; i < n_; ++i) zmq_msg_close(&msg_[i]);
    n_ = 0;
    parts_ = 0;
  }
  zmq_msg_t msg_[kMax];
  int n_ = 0;
  int parts_ = 0;
};

std::string zmq_error(const char* what) { return std::string(what) + ": " + zmq_strerror(zmq_errno()); }

}  // namespace

struct KvEventSubscriber::RankState {
  std::string endpoint;
  std::string replay_endpoint;
  void* sub = nullptr;
  void* monitor = nullptr;
  bool connected = false;
  bool ever_connected = false;
  bool have_seq = false;       // a batch of this publisher has been applied
  std::int64_t last = -1;      // seq of the last batch applied
  std::int64_t dup_floor = kNoFloor;  // seqs in [dup_floor, last] were applied by a replay: duplicates
  bool native = false;         // payload encoding, from the topic of the latest live message
  bool topic_seen = false;     // a live message has told the encoding (replays at connect come before one)
};

KvEventSubscriber::KvEventSubscriber(hashing::PrefixIndex& index, SubscriberOptions options)
    : index_(index), opt_(std::move(options)) {
  if (opt_.dp_size == 0) opt_.dp_size = 1;
  opt_.applier.ranks = opt_.dp_size;
}

KvEventSubscriber::~KvEventSubscriber() { stop(); }

Result<std::string> KvEventSubscriber::rank_endpoint(std::string_view base, std::uint32_t rank) {
  if (rank == 0) return std::string(base);
  if (base.substr(0, 6) != "tcp://") {
    return make_error("KV events: data-parallel rank endpoints need tcp://host:port, got '" + std::string(base) + "'");
  }
  const std::size_t colon = base.rfind(':');
  if (colon == std::string_view::npos || colon < 6) {
    return make_error("KV events: endpoint '" + std::string(base) + "' has no port");
  }
  std::uint32_t port = 0;
  const std::string_view p = base.substr(colon + 1);
  auto [end, ec] = std::from_chars(p.data(), p.data() + p.size(), port);
  if (ec != std::errc() || end != p.data() + p.size() || port == 0 || port + rank > 65535) {
    return make_error("KV events: bad port in endpoint '" + std::string(base) + "' for rank " + std::to_string(rank));
  }
  return std::string(base.substr(0, colon + 1)) + std::to_string(port + rank);
}

Result<Decoded> KvEventSubscriber::start() {
  if (started_) return make_error("KV events: subscriber already started");
  if (opt_.endpoint.empty()) return make_error("KV events: no publisher endpoint for worker " + std::to_string(worker()));
  if (opt_.endpoint.find('*') != std::string::npos) {
    return make_error("KV events: endpoint '" + opt_.endpoint + "' is a bind address; give the worker's host");
  }
  // Build everything first; on any error, tear down what was made.
  ctx_ = opt_.zmq_context;
  own_ctx_ = ctx_ == nullptr;
  if (own_ctx_) ctx_ = zmq_ctx_new();
  if (ctx_ == nullptr) return make_error(zmq_error("KV events: zmq_ctx_new"));

  static std::atomic<std::uint64_t> monitor_ids{0};
  auto cleanup = [this] {
    for (auto& r : ranks_) {
      if (r->sub) zmq_close(r->sub);
      if (r->monitor) zmq_close(r->monitor);
    }
    ranks_.clear();
    if (own_ctx_ && ctx_) zmq_ctx_term(ctx_);
    ctx_ = nullptr;
  };
  for (std::uint32_t r = 0; r < opt_.dp_size; ++r) {
    auto rs = std::make_unique<RankState>();
    auto ep = rank_endpoint(opt_.endpoint, r);
    if (!ep) {
      cleanup();
      return ep.error();
    }
    rs->endpoint = *ep;
    if (!opt_.replay_endpoint.empty()) {
      auto rep = rank_endpoint(opt_.replay_endpoint, r);
      if (!rep) {
        cleanup();
        return rep.error();
      }
      rs->replay_endpoint = *rep;
    }
    rs->native = opt_.encoding == PayloadEncoding::kNative ||
                 (opt_.encoding == PayloadEncoding::kAuto && opt_.topic.starts_with(kNativeTopicPrefix));
    rs->sub = zmq_socket(ctx_, ZMQ_SUB);
    if (rs->sub == nullptr) {
      cleanup();
      return make_error(zmq_error("KV events: zmq_socket(SUB)"));
    }
    const int linger = 0;
    const int hwm = opt_.receive_hwm;
    const int hb = static_cast<int>(opt_.heartbeat.count());
    const int hb_timeout = hb * 3;
    const int reconnect_max = 2000;
    zmq_setsockopt(rs->sub, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(rs->sub, ZMQ_RCVHWM, &hwm, sizeof hwm);
    zmq_setsockopt(rs->sub, ZMQ_RECONNECT_IVL_MAX, &reconnect_max, sizeof reconnect_max);
    if (hb > 0) {
      zmq_setsockopt(rs->sub, ZMQ_HEARTBEAT_IVL, &hb, sizeof hb);
      zmq_setsockopt(rs->sub, ZMQ_HEARTBEAT_TIMEOUT, &hb_timeout, sizeof hb_timeout);
    }
    zmq_setsockopt(rs->sub, ZMQ_SUBSCRIBE, opt_.topic.data(), opt_.topic.size());
    // The monitor reports connects and disconnects, which is what liveness is made of.
    const std::string mon = "inproc://kvroute-kv-events-monitor-" + std::to_string(monitor_ids.fetch_add(1));
    if (zmq_socket_monitor(rs->sub, mon.c_str(), ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED) != 0) {
      ranks_.push_back(std::move(rs));
      cleanup();
      return make_error(zmq_error("KV events: zmq_socket_monitor"));
    }
    rs->monitor = zmq_socket(ctx_, ZMQ_PAIR);
    if (rs->monitor == nullptr || zmq_setsockopt(rs->monitor, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
        zmq_connect(rs->monitor, mon.c_str()) != 0) {
      ranks_.push_back(std::move(rs));
      cleanup();
      return make_error(zmq_error("KV events: monitor socket"));
    }
    if (zmq_connect(rs->sub, rs->endpoint.c_str()) != 0) {
      std::string msg = zmq_error(("KV events: connect to '" + rs->endpoint + "'").c_str());
      ranks_.push_back(std::move(rs));
      cleanup();
      return make_error(msg);
    }
    ranks_.push_back(std::move(rs));
  }
  applier_ = std::make_unique<KvEventApplier>(index_, opt_.applier);
  stop_.store(false);
  started_ = true;
  thread_ = std::thread([this] { run(); });
  return Decoded{};
}

void KvEventSubscriber::stop() {
  if (!started_) return;
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  for (auto& r : ranks_) {
    if (r->sub) {
      zmq_socket_monitor(r->sub, nullptr, 0);
      zmq_close(r->sub);
    }
    if (r->monitor) zmq_close(r->monitor);
  }
  ranks_.clear();
  if (own_ctx_ && ctx_) zmq_ctx_term(ctx_);
  ctx_ = nullptr;
  started_ = false;
  live_.store(false);
}

SubscriberStatus KvEventSubscriber::status() const {
  SubscriberStatus s;
  s.live = live_.load(std::memory_order_relaxed);
  s.messages = counters_.messages.load(std::memory_order_relaxed);
  s.batches_applied = counters_.batches.load(std::memory_order_relaxed);
  s.events_applied = counters_.events.load(std::memory_order_relaxed);
  s.malformed_frames = counters_.malformed.load(std::memory_order_relaxed);
  s.gaps = counters_.gaps.load(std::memory_order_relaxed);
  s.replays = counters_.replays.load(std::memory_order_relaxed);
  s.replay_failures = counters_.replay_failures.load(std::memory_order_relaxed);
  s.duplicates = counters_.duplicates.load(std::memory_order_relaxed);
  s.restarts = counters_.restarts.load(std::memory_order_relaxed);
  s.resets = counters_.resets.load(std::memory_order_relaxed);
  if (const double lag = counters_.last_batch_lag_s.load(std::memory_order_relaxed); !std::isnan(lag)) s.last_batch_lag_s = lag;
  const std::int64_t ns = counters_.last_message_ns.load(std::memory_order_relaxed);
  if (ns != 0) {
    s.last_message = std::chrono::system_clock::time_point(
        std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::nanoseconds(ns)));
  }
  std::lock_guard lock(snapshot_mu_);
  s.connected = connected_snapshot_;
  s.applier = applier_snapshot_;
  s.last_error = last_error_;
  return s;
}

void KvEventSubscriber::note_error(std::string message) {
  std::lock_guard lock(snapshot_mu_);
  last_error_ = std::move(message);
}

void KvEventSubscriber::publish_snapshot() {
  ApplierStats a = applier_->stats();
  bool connected = true;
  for (auto& r : ranks_) connected = connected && r->connected;
  std::lock_guard lock(snapshot_mu_);
  applier_snapshot_ = a;
  connected_snapshot_ = connected;
}

// ---------------------------------------------------------------------------------------------------------
// The subscriber thread.

void KvEventSubscriber::run() {
  std::vector<zmq_pollitem_t> items;
  for (auto& r : ranks_) {
    items.push_back(zmq_pollitem_t{r->monitor, 0, ZMQ_POLLIN, 0});
    items.push_back(zmq_pollitem_t{r->sub, 0, ZMQ_POLLIN, 0});
  }
  Frames f;
  while (!stop_.load(std::memory_order_relaxed)) {
    const int rc = zmq_poll(items.data(), static_cast<int>(items.size()), static_cast<long>(opt_.poll_interval.count()));
    if (rc < 0) {
      if (zmq_errno() == ETERM) break;
      continue;  // EINTR
    }
    for (std::uint32_t r = 0; r < ranks_.size() && !stop_.load(std::memory_order_relaxed); ++r) {
      if (items[2 * r].revents & ZMQ_POLLIN) handle_monitor(r);
      if (!(items[2 * r + 1].revents & ZMQ_POLLIN)) continue;
      for (int k = 0; k < kMaxDrainPerRound && f.recv(ranks_[r]->sub, ZMQ_DONTWAIT); ++k) {
        counters_.last_message_ns.store(now_ns(), std::memory_order_relaxed);
        if (f.parts() != 3 || f.bytes(1).size() != 8) {
          counters_.malformed.fetch_add(1, std::memory_order_relaxed);
          note_error("KV events: message with " + std::to_string(f.parts()) +
                     " frames (expected [topic, seq(8 bytes), payload])");
          continue;
        }
        counters_.messages.fetch_add(1, std::memory_order_relaxed);
        on_message(r, f.text(0), load_be64(f.bytes(1).data()), f.bytes(2));
      }
    }
    publish_snapshot();
    update_liveness();
  }
}

void KvEventSubscriber::handle_monitor(std::uint32_t r) {
  RankState& s = *ranks_[r];
  Frames f;
  while (f.recv(s.monitor, ZMQ_DONTWAIT)) {
    if (f.parts() < 1 || f.bytes(0).size() < 6) continue;
    std::uint16_t event = 0;
    std::memcpy(&event, f.bytes(0).data(), sizeof event);  // libzmq: native-endian uint16 event id
    if (event == ZMQ_EVENT_CONNECTED) {
      const bool reconnect = s.ever_connected;
      s.connected = true;
      s.ever_connected = true;
      // Catch up on what was published while we were away, or, on first contact, on what the engine
      // stored before the router started. Batches that also arrive live are recognised as duplicates.
      if (!s.replay_endpoint.empty()) {
        if (s.have_seq) {
          s.dup_floor = s.last + 1;
          std::int64_t first = -1;
          replay(r, s.last + 1, first);
        } else if (!reconnect) {
          std::int64_t first = -1;
          replay(r, 0, first);
          if (s.have_seq) s.dup_floor = first;
        }
      }
    } else if (event == ZMQ_EVENT_DISCONNECTED) {
      s.connected = false;
    }
  }
}

void KvEventSubscriber::update_liveness() {
  bool connected = true;
  for (auto& r : ranks_) connected = connected && r->connected;
  bool stale = false;
  if (opt_.stale_after.count() > 0) {
    const std::int64_t last = counters_.last_message_ns.load(std::memory_order_relaxed);
    const std::int64_t limit = std::chrono::duration_cast<std::chrono::nanoseconds>(opt_.stale_after).count();
    stale = last == 0 || now_ns() - last > limit;
  }
  const bool live = connected && !stale;
  if (live == live_.load(std::memory_order_relaxed)) return;
  live_.store(live, std::memory_order_relaxed);
  if (liveness_listener_) {
    liveness_listener_(worker(), live, live ? "event stream connected" : !connected ? "publisher disconnected"
                                                                                    : "no events within stale_after");
  }
}

void KvEventSubscriber::on_message(std::uint32_t r, std::string_view topic, std::int64_t seq,
                                   std::span<const std::uint8_t> payload) {
  RankState& s = *ranks_[r];
  if (opt_.encoding == PayloadEncoding::kAuto) {
    s.native = topic.starts_with(kNativeTopicPrefix);
    s.topic_seen = true;
  }
  if (seq < 0) {
    counters_.malformed.fetch_add(1, std::memory_order_relaxed);
    note_error("KV events: negative sequence number on the live stream");
    return;
  }
  const bool can_replay = !s.replay_endpoint.empty();
  bool replayed = false;
  if (!s.have_seq && seq > 0 && can_replay) {
    // Joined a running publisher: read its buffer from the start first.
    std::int64_t first = -1;
    s.dup_floor = seq;
    replay(r, 0, first);
    replayed = true;
  } else if (s.have_seq && seq > s.last + 1) {
    counters_.gaps.fetch_add(1, std::memory_order_relaxed);
    if (can_replay) {
      std::int64_t first = -1;
      s.dup_floor = seq;
      replay(r, s.last + 1, first);
      replayed = true;
    }
  }
  if (s.have_seq && seq > s.last + 1) {
    // Batches between last and seq are lost for good: whatever they removed may still be in the index.
    if (replayed) counters_.replay_failures.fetch_add(1, std::memory_order_relaxed);
    reset_rank(r, "sequence gap the replay could not fill");
    s.have_seq = false;
  }
  apply_in_order(r, topic, seq, payload, false);
}

void KvEventSubscriber::apply_in_order(std::uint32_t r, std::string_view topic, std::int64_t seq,
                                       std::span<const std::uint8_t> payload, bool from_replay) {
  RankState& s = *ranks_[r];
  if (!s.have_seq || seq == s.last + 1) {
    s.have_seq = true;
    s.last = seq;
    if (!from_replay) s.dup_floor = kNoFloor;
    decode_and_apply(r, topic, payload);
    return;
  }
  if (seq <= s.last) {
    if (from_replay || seq >= s.dup_floor) {
      counters_.duplicates.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    // The counter went backwards: a new publisher (engine restart), whose cache starts empty.
    counters_.restarts.fetch_add(1, std::memory_order_relaxed);
    reset_rank(r, "publisher restarted");
    s.last = seq;
    s.dup_floor = kNoFloor;
    decode_and_apply(r, topic, payload);
    return;
  }
  // seq > last + 1 inside a replay: the buffer no longer reaches back to the gap.
  reset_rank(r, "replay buffer does not cover the gap");
  s.last = seq;
  decode_and_apply(r, topic, payload);
}

void KvEventSubscriber::decode_and_apply(std::uint32_t r, std::string_view topic, std::span<const std::uint8_t> payload) {
  (void)topic;
  RankState& s = *ranks_[r];
  bool native = s.native;
  if (opt_.encoding == PayloadEncoding::kAuto && !s.topic_seen && !payload.empty()) {
    // The replay read at first contact comes before any live message (and replayed frames carry no topic):
    // tell the encoding by the payload. A vLLM batch is a msgpack array or map; a protobuf EventBatch starts
    // with a field tag of one of its low-numbered fields, which msgpack would read as a positive integer.
    const std::uint8_t b = payload.front();
    native = !((b >= 0x80 && b <= 0x9f) || (b >= 0xdc && b <= 0xdf));
  }
  std::optional<WorkerTelemetry> load;
  Result<Decoded> st = native ? native_.decode(payload, opt_.limits, batch_, load)
                              : decode_vllm_batch(payload, opt_.limits, batch_);
  if (!st) {
    counters_.malformed.fetch_add(1, std::memory_order_relaxed);
    note_error(st.error().message);
    return;
  }
  applier_->apply(batch_, r);
  if (batch_.ts > 0) counters_.last_batch_lag_s.store(static_cast<double>(now_ns()) * 1e-9 - batch_.ts, std::memory_order_relaxed);
  counters_.batches.fetch_add(1, std::memory_order_relaxed);
  counters_.events.fetch_add(batch_.events.size(), std::memory_order_relaxed);
  if (load && telemetry_listener_) telemetry_listener_(worker(), *load);
}

void KvEventSubscriber::reset_rank(std::uint32_t r, const char* why) {
  counters_.resets.fetch_add(1, std::memory_order_relaxed);
  applier_->reset_rank(r);
  note_error(std::string("KV events: reset worker ") + std::to_string(worker()) + " rank " + std::to_string(r) +
             ": " + why);
}

bool KvEventSubscriber::replay(std::uint32_t r, std::int64_t start, std::int64_t& first_seen) {
  RankState& s = *ranks_[r];
  first_seen = -1;
  if (s.replay_endpoint.empty()) return false;
  // A fresh DEALER per replay: answers to an abandoned request can never be mistaken for this one's.
  void* d = zmq_socket(ctx_, ZMQ_DEALER);
  if (d == nullptr) {
    counters_.replay_failures.fetch_add(1, std::memory_order_relaxed);
    note_error(zmq_error("KV events: replay socket"));
    return false;
  }
  const int linger = 0;
  zmq_setsockopt(d, ZMQ_LINGER, &linger, sizeof linger);
  auto fail = [&](std::string msg) {
    counters_.replay_failures.fetch_add(1, std::memory_order_relaxed);
    note_error(std::move(msg));
    zmq_close(d);
    return false;
  };
  if (zmq_connect(d, s.replay_endpoint.c_str()) != 0) return fail(zmq_error("KV events: replay connect"));
  std::uint8_t seq_be[8];
  store_be64(start, seq_be);
  if (zmq_send(d, nullptr, 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 || zmq_send(d, seq_be, 8, ZMQ_DONTWAIT) < 0) {
    return fail(zmq_error("KV events: replay request"));
  }
  Frames f;
  auto idle_since = std::chrono::steady_clock::now();
  while (true) {
    if (stop_.load(std::memory_order_relaxed)) return fail("KV events: replay interrupted by stop");
    zmq_pollitem_t item{d, 0, ZMQ_POLLIN, 0};
    const int rc = zmq_poll(&item, 1, static_cast<long>(opt_.poll_interval.count()));
    if (rc < 0 && zmq_errno() == ETERM) return fail("KV events: context terminated during replay");
    if (rc <= 0) {
      if (std::chrono::steady_clock::now() - idle_since > opt_.replay_timeout) {
        return fail("KV events: replay from " + s.replay_endpoint + " timed out");
      }
      continue;
    }
    while (f.recv(d, ZMQ_DONTWAIT)) {
      idle_since = std::chrono::steady_clock::now();
      if (f.parts() != 3 || !f.bytes(0).empty() || f.bytes(1).size() != 8) {
        counters_.malformed.fetch_add(1, std::memory_order_relaxed);
        note_error("KV events: malformed replay message (expected [empty, seq(8 bytes), payload])");
        continue;
      }
      const std::int64_t seq = load_be64(f.bytes(1).data());
      if (seq == -1) {
        counters_.replays.fetch_add(1, std::memory_order_relaxed);
        zmq_close(d);
        return true;
      }
      if (seq < 0) {
        counters_.malformed.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      counters_.messages.fetch_add(1, std::memory_order_relaxed);
      if (first_seen < 0) first_seen = seq;
      apply_in_order(r, {}, seq, f.bytes(2), true);
    }
  }
}

}  // namespace kvroute::events
