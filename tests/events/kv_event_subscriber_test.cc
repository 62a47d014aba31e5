// The ZMQ subscriber against a real in-process publisher (PUB + replay ROUTER on 127.0.0.1, ephemeral
// ports): in-order batches, gaps filled by replay, gaps that cannot be filled, publisher restarts, malformed
// and oversized frames, the native stream, data-parallel ranks, liveness and a prompt stop.
#include "backends/events/kv_event_subscriber.h"

#include <gtest/gtest.h>

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <atomic>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>

#include "backends/events/vllm_events.h"
#include "hashing/block_chain.h"

namespace kvroute::events {
namespace {

using namespace std::chrono_literals;
using hashing::PrefixIndex;

std::string be64(std::int64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(static_cast<std::uint64_t>(v) >> (56 - 8 * i));
  return s;
}

// A vLLM-like publisher: PUB for the live stream, ROUTER answering replay requests from its buffer.
class FakePublisher {
 public:
  // port 0: ephemeral. Otherwise bind exactly these ports (data-parallel tests).
  explicit FakePublisher(zmq::context_t& ctx, int pub_port = 0, int replay_port = 0)
      : pub_(ctx, zmq::socket_type::pub), router_(ctx, zmq::socket_type::router) {
    pub_.set(zmq::sockopt::linger, 0);
    router_.set(zmq::sockopt::linger, 0);
    pub_.bind(pub_port ? "tcp://127.0.0.1:" + std::to_string(pub_port) : "tcp://127.0.0.1:*");
    router_.bind(replay_port ? "tcp://127.0.0.1:" + std::to_string(replay_port) : "tcp://127.0.0.1:*");
    endpoint_ = pub_.get(zmq::sockopt::last_endpoint);
    replay_endpoint_ = router_.get(zmq::sockopt::last_endpoint);
    thread_ = std::thread([this] { serve_replays(); });
  }
  ~FakePublisher() { close(); }

  void close() {
    if (stop_.exchange(true)) return;
    thread_.join();
    pub_.close();
    router_.close();
  }

  const std::string& endpoint() const { return endpoint_; }
  const std::string& replay_endpoint() const { return replay_endpoint_; }

  // Buffers the batch for replay and, unless `lose` is set, publishes it.
  void publish(std::int64_t seq, std::string payload, bool lose = false, std::string topic = "kv") {
    {
      std::lock_guard lock(mu_);
      buffer_[seq] = payload;
    }
    if (lose) return;
    std::array<zmq::const_buffer, 3> frames = {zmq::buffer(topic), zmq::buffer(be64(seq)), zmq::buffer(payload)};
    // zmq::buffer over temporaries is fine: send copies synchronously.
    std::string s = be64(seq);
    frames[1] = zmq::buffer(s);
    zmq::send_multipart(pub_, frames);
  }
  void send_raw(const std::vector<std::string>& frames) {
    std::vector<zmq::const_buffer> b;
    for (const auto& f : frames) b.push_back(zmq::buffer(f));
    zmq::send_multipart(pub_, b);
  }
  void forget(std::int64_t seq) {
    std::lock_guard lock(mu_);
    buffer_.erase(seq);
  }
  void forget_all() {
    std::lock_guard lock(mu_);
    buffer_.clear();
  }
  int replay_requests() const { return replay_requests_.load(); }

 private:
  void serve_replays() {
    while (!stop_) {
      zmq::pollitem_t item{router_.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, 20ms);
      if (!(item.revents & ZMQ_POLLIN)) continue;
      std::vector<zmq::message_t> req;
      if (!zmq::recv_multipart(router_, std::back_inserter(req))) continue;
      if (req.size() != 3 || req[2].size() != 8) continue;  // [identity, empty, start]
      std::int64_t start = 0;
      for (int i = 0; i < 8; ++i) start = (start << 8) | static_cast<const std::uint8_t*>(req[2].data())[i];
      ++replay_requests_;
      const std::string id = req[0].to_string();
      std::map<std::int64_t, std::string> copy;
      {
        std::lock_guard lock(mu_);
        copy = buffer_;
      }
      for (auto it = copy.lower_bound(start); it != copy.end(); ++it) {
        std::string s = be64(it->first);
        std::array<zmq::const_buffer, 4> f = {zmq::buffer(id), zmq::const_buffer(), zmq::buffer(s),
                                              zmq::buffer(it->second)};
        zmq::send_multipart(router_, f);
      }
      std::string end = be64(-1);
      std::array<zmq::const_buffer, 4> f = {zmq::buffer(id), zmq::const_buffer(), zmq::buffer(end),
                                            zmq::const_buffer()};
      zmq::send_multipart(router_, f);
    }
  }

  zmq::socket_t pub_;
  zmq::socket_t router_;
  std::string endpoint_, replay_endpoint_;
  std::mutex mu_;
  std::map<std::int64_t, std::string> buffer_;  // guarded by mu_
  std::atomic<bool> stop_{false};
  std::atomic<int> replay_requests_{0};
  std::thread thread_;
};

// Payload storing `n` 16-token blocks with engine hashes base.. chained from `parent`, tokens from `tok`.
std::string stored_payload(std::uint64_t base, int n, std::optional<std::uint64_t> parent, std::uint32_t tok,
                           VllmShape shape = VllmShape::kArrayPositional) {
  KvEventBatch b;
  std::vector<std::uint64_t> hs(n);
  std::iota(hs.begin(), hs.end(), base);
  std::vector<std::uint32_t> t(16 * n);
  std::iota(t.begin(), t.end(), tok);
  b.add_stored(hs, parent, t, 16);
  auto bytes = encode_vllm_batch(b, shape);
  return std::string(bytes.begin(), bytes.end());
}

std::string removed_payload(std::vector<std::uint64_t> hs) {
  KvEventBatch b;
  b.add_removed(hs);
  auto bytes = encode_vllm_batch(b, VllmShape::kMapMapEvents);
  return std::string(bytes.begin(), bytes.end());
}

template <class Pred>
bool wait_for(Pred p, std::chrono::milliseconds limit = 5s) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (p()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return p();
}

// Blocks matched for the prompt made of tokens tok, tok+1, ... (n blocks).
std::uint32_t matched(const PrefixIndex& index, std::uint32_t tok, int n, hashing::WorkerId w = 0) {
  std::vector<std::uint32_t> t(16 * n);
  std::iota(t.begin(), t.end(), tok);
  auto c = hashing::hash_tokens(hashing::namespace_root("m", ""), t);
  PrefixIndex::Match m;
  index.match(c.hashes, m);
  return m.of(w);
}

class SubscriberTest : public ::testing::Test {
 protected:
  zmq::context_t ctx{1};
  PrefixIndex index;

  SubscriberOptions options(const FakePublisher& p, bool with_replay = true) {
    SubscriberOptions o;
    o.applier.worker = 0;
    o.applier.model = "m";
    o.endpoint = p.endpoint();
    if (with_replay) o.replay_endpoint = p.replay_endpoint();
    o.topic = "";
    o.replay_timeout = 1000ms;
    o.poll_interval = 10ms;
    return o;
  }
  // Waits until connected and the subscription has reached the publisher (probe batches until one lands).
  static void wait_ready(KvEventSubscriber& s) {
    ASSERT_TRUE(wait_for([&] { return s.live(); })) << "never connected";
    std::this_thread::sleep_for(200ms);  // PUB learns of the subscription asynchronously ("slow joiner")
  }
};

TEST_F(SubscriberTest, AppliesBatchesInOrder) {
  FakePublisher pub(ctx);
  KvEventSubscriber sub(index, options(pub));
  ASSERT_TRUE(sub.start());
  wait_ready(sub);
  pub.publish(0, stored_payload(1, 2, std::nullopt, 100));
  pub.publish(1, stored_payload(3, 1, 2, 132, VllmShape::kArrayMapEvents));
  pub.publish(2, stored_payload(4, 1, 3, 148, VllmShape::kMapMapEvents));
  ASSERT_TRUE(wait_for([&] { return sub.status().batches_applied == 3; }));
  EXPECT_EQ(matched(index, 100, 4), 4u);
  pub.publish(3, removed_payload({4}));
  ASSERT_TRUE(wait_for([&] { return sub.status().batches_applied == 4; }));
  EXPECT_EQ(matched(index, 100, 4), 3u);
  SubscriberStatus s = sub.status();
  EXPECT_EQ(s.gaps, 0u);
  EXPECT_EQ(s.malformed_frames, 0u);
  EXPECT_EQ(s.resets, 0u);
  EXPECT_EQ(s.events_applied, 4u);
  EXPECT_TRUE(s.connected);
  EXPECT_GT(s.last_message.time_since_epoch().count(), 0);
  ASSERT_TRUE(wait_for([&] { return sub.status().applier.blocks_stored == 4; }));
}

TEST_F(SubscriberTest, GapIsFilledByReplay) {
  FakePublisher pub(ctx);
  KvEventSubscriber sub(index, options(pub));
  ASSERT_TRUE(sub.start());
  wait_ready(sub);
  const int replays_before = pub.replay_requests();
  pub.publish(0, stored_payload(1, 1, std::nullopt, 100));
  pub.publish(1, stored_payload(2, 1, 1, 116), /*lose=*/true);
  pub.publish(2, stored_payload(3, 1, 2, 132), /*lose=*/true);
  pub.publish(3, stored_payload(4, 1, 3, 148));
  ASSERT_TRUE(wait_for([&] { return sub.status().batches_applied == 4; }));
  EXPECT_EQ(matched(index, 100, 4), 4u);
  SubscriberStatus s = sub.status();
  EXPECT_EQ(s.gaps, 1u);
  EXPECT_EQ(pub.replay_requests() - replays_before, 1);
  EXPECT_GE(s.replays, 1u);
  EXPECT_EQ(s.duplicates, 1u);  // seq 3 came by replay and again live
  EXPECT_EQ(s.resets, 0u);
  pub.publish(4, removed_payload({1}));
  ASSERT_TRUE(wait_for([&] { return sub.status().batches_applied == 5; }));
  EXPECT_EQ(matched(index, 100, 4), 0u);
}

TEST_F(SubscriberTest, GapTheBufferNoLongerHoldsResetsTheWorker) {
  FakePublisher pub(ctx);
  KvEventSubscriber sub(index, options(pub));
  ASSERT_TRUE(sub.start());
  wait_ready(sub);
  pub.publish(0, stored_payload(1, 2, std::nullopt, 100));
  ASSERT_TRUE(wait_for([&] { return sub.status().batches_applied == 1; }));
  pub.publish(1, removed_payload({2}), /*lose=*/true);
  pub.forget(1);  // rotated out of the replay buffer
  pub.publish(2, stored_payload(10, 1, std::nullopt, 500));
  ASSERT_TRUE(wait_for([&] { return sub.status().batches_applied == 2; }));
  SubscriberStatus s = sub.status();
  EXPECT_EQ(s.gaps, 1u);
  EXPECT_GE(s.resets, 1u);
  // Entries from before the lost batch are gone (block 2 might have been removed); the new batch is in.
  EXPECT_EQ(matched(index, 100, 2), 0u);
  EXPECT_EQ(matched(index, 500, 1), 1u);
}

TEST_F(SubscriberTest, GapWithoutReplayEndpointResets) {
  FakePublisher pub(ctx);
  KvEventSubscriber sub(index, options(pub, /*with_replay=*/false));
  ASSERT_TRUE(sub.start());
  wait_ready(sub);
  pub.publish(0, stored_payload(1, 1, std::nullopt, 100));
  pub.publish(5, stored_payload(10, 1, std::nullopt, 500));
  ASSERT_TRUE(wait_for([&] { return sub.status().batches_applied == 2; }));
  EXPECT_EQ(sub.status().gaps, 1u);
  EXPECT_EQ(sub.status().resets, 1u);
  EXPECT_EQ(matched(index, 100, 1), 0u);
  EXPECT_EQ(matched(index, 500, 1), 1u);
}

TEST_F(SubscriberTest, PublisherRestartResetsTheWorker) {
  FakePublisher pub(ctx);
  KvEventSubscriber sub(index, options(pub));
  ASSERT_TRUE(sub.start());
  wait_ready(sub);
  for (int i = 0; i < 4; ++i) pub.publish(i, stored_payload(1 + i, 1, i == 0 ? std::nullopt : std::optional<std::uint64_t>(i), 100 + 16 * i));
  ASSERT_TRUE(wait_for([&] { return sub.status().batches_applied == 4; }));
  EXPECT_EQ(matched(index, 100, 4), 4u);
  // The engine restarts: its counter starts again at 0 and its cache is empty.
  pub.forget_all();
  pub.publish(0, stored_payload(77, 1, std::nullopt, 900));
  ASSERT_TRUE(wait_for([&] { return sub.status().batches_applied == 5; }));
  SubscriberStatus s = sub.status();
  EXPECT_EQ(s.restarts, 1u);
  EXPECT_EQ(s.resets, 1u);
  EXPECT_EQ(matched(index, 100, 4), 0u);
  EXPECT_EQ(matched(index, 900, 1), 1u);
  EXPECT_EQ(index.worker_blocks(0), 1u);
}

TEST_F(SubscriberTest, MalformedAndOversizedFramesAreCountedAndSkipped) {
  FakePublisher pub(ctx);
  SubscriberOptions o = options(pub);
  o.limits.max_frame_bytes = 2048;
  KvEventSubscriber sub(index, o);
  ASSERT_TRUE(sub.start());
  wait_ready(sub);
  pub.publish(0, stored_payload(1, 1, std::nullopt, 100));
  pub.send_raw({"kv", be64(1)});                                // two frames
  pub.send_raw({"kv", "\x00\x01\x02\x03", "x"});               // 4-byte seq
  pub.send_raw({"kv", be64(1), "x", "y"});                      // four frames
  pub.publish(1, std::string("\x93\xcb\x00", 3));               // truncated msgpack
  pub.publish(2, stored_payload(2, 64, 1, 116));                // 64 blocks: > 2 KiB
  pub.publish(3, std::string("\xc1", 1));                       // never-used msgpack byte
  pub.publish(4, stored_payload(200, 1, 1, 116));               // valid, applied
  ASSERT_TRUE(wait_for([&] { return sub.status().batches_applied == 2; }));
  SubscriberStatus s = sub.status();
  EXPECT_EQ(s.malformed_frames, 6u);
  EXPECT_EQ(s.gaps, 0u);  // malformed payloads still consume their sequence number
  EXPECT_FALSE(s.last_error.empty());
  EXPECT_EQ(matched(index, 100, 2), 2u);
}

TEST_F(SubscriberTest, NativeStreamWithLoadReports) {
  FakePublisher pub(ctx);
  KvEventSubscriber sub(index, options(pub));
  std::mutex mu;
  std::optional<WorkerTelemetry> seen;
  sub.set_telemetry_listener([&](hashing::WorkerId, const WorkerTelemetry& t) {
    std::lock_guard lock(mu);
    seen = t;
  });
  ASSERT_TRUE(sub.start());
  wait_ready(sub);
  KvEventBatch b;
  std::vector<std::uint32_t> t(32);
  std::iota(t.begin(), t.end(), 100u);
  const std::uint64_t hs[] = {5, 6};
  b.add_stored(hs, std::nullopt, t, 16, Medium::kCpu);
  WorkerTelemetry load;
  load.running = 2;
  load.waiting = 1;
  load.kv_usage = 0.25;
  load.num_gpu_blocks = 4096;
  pub.publish(0, encode_native_batch(b, &load), false, "kvroute.v1.events");
  ASSERT_TRUE(wait_for([&] { return sub.status().batches_applied == 1; }));
  PrefixIndex::Match m;
  std::vector<std::uint32_t> t2 = t;
  auto c = hashing::hash_tokens(hashing::namespace_root("m", ""), t2);
  index.match(c.hashes, m);
  EXPECT_EQ(m.of(0), 2u);
  EXPECT_EQ(m.cpu_of(0), 2u);
  std::lock_guard lock(mu);
  ASSERT_TRUE(seen.has_value());
  EXPECT_EQ(*seen->num_gpu_blocks, 4096u);
  EXPECT_EQ(*seen->running, 2);
}

TEST_F(SubscriberTest, JoiningARunningPublisherReadsItsReplayBuffer) {
  FakePublisher pub(ctx);
  // Published before the router existed: only the replay buffer has them.
  pub.publish(0, stored_payload(1, 1, std::nullopt, 100), true);
  pub.publish(1, stored_payload(2, 1, 1, 116), true);
  KvEventSubscriber sub(index, options(pub));
  ASSERT_TRUE(sub.start());
  wait_ready(sub);
  ASSERT_TRUE(wait_for([&] { return sub.status().batches_applied == 2; }));
  pub.publish(2, stored_payload(3, 1, 2, 132));
  ASSERT_TRUE(wait_for([&] { return sub.status().batches_applied == 3; }));
  EXPECT_EQ(matched(index, 100, 3), 3u);
  EXPECT_EQ(sub.status().resets, 0u);
  EXPECT_EQ(sub.status().gaps, 0u);
}

TEST_F(SubscriberTest, LivenessFollowsTheConnection) {
  auto pub = std::make_unique<FakePublisher>(ctx);
  SubscriberOptions o = options(*pub);
  o.heartbeat = 200ms;
  KvEventSubscriber sub(index, o);
  std::mutex mu;
  std::vector<bool> changes;
  sub.set_liveness_listener([&](hashing::WorkerId w, bool live, std::string_view why) {
    std::lock_guard lock(mu);
    changes.push_back(live);
    EXPECT_EQ(w, 0);
    EXPECT_FALSE(why.empty());
  });
  ASSERT_TRUE(sub.start());
  ASSERT_TRUE(wait_for([&] { return sub.live(); }));
  pub->close();
  ASSERT_TRUE(wait_for([&] { return !sub.live(); }));
  EXPECT_FALSE(sub.status().connected);
  std::lock_guard lock(mu);
  ASSERT_GE(changes.size(), 2u);
  EXPECT_TRUE(changes[0]);
  EXPECT_FALSE(changes.back());
}

TEST_F(SubscriberTest, SilenceMakesTheStreamStaleWhenConfigured) {
  FakePublisher pub(ctx);
  SubscriberOptions o = options(pub);
  o.stale_after = 300ms;
  KvEventSubscriber sub(index, o);
  ASSERT_TRUE(sub.start());
  ASSERT_TRUE(wait_for([&] { return sub.status().connected; }));
  std::this_thread::sleep_for(200ms);
  pub.publish(0, stored_payload(1, 1, std::nullopt, 100));
  ASSERT_TRUE(wait_for([&] { return sub.live(); }));
  ASSERT_TRUE(wait_for([&] { return !sub.live(); }, 2s));
  EXPECT_TRUE(sub.status().connected);
}

TEST_F(SubscriberTest, DataParallelRanksUseConsecutivePorts) {
  // Find two consecutive free ports for the PUBs and two for the ROUTERs.
  std::mt19937 rng(std::random_device{}());
  std::unique_ptr<FakePublisher> r0, r1;
  for (int attempt = 0; attempt < 50 && !r1; ++attempt) {
    const int base = 20000 + static_cast<int>(rng() % 30000);
    try {
      auto a = std::make_unique<FakePublisher>(ctx, base, base + 2);
      auto b = std::make_unique<FakePublisher>(ctx, base + 1, base + 3);
      r0 = std::move(a);
      r1 = std::move(b);
    } catch (const zmq::error_t&) {
      r0.reset();
    }
  }
  ASSERT_TRUE(r1) << "no free ports";
  SubscriberOptions o = options(*r0);
  o.dp_size = 2;
  KvEventSubscriber sub(index, o);
  ASSERT_TRUE(sub.start());
  wait_ready(sub);
  r0->publish(0, stored_payload(1, 2, std::nullopt, 100));
  r1->publish(0, stored_payload(1, 1, std::nullopt, 100));  // same engine hash, other rank: independent
  ASSERT_TRUE(wait_for([&] { return sub.status().batches_applied == 2; }));
  EXPECT_EQ(matched(index, 100, 2), 2u);
  // Rank 0 restarts; rank 1 still holds the first block.
  r0->forget_all();
  r0->publish(0, stored_payload(50, 1, std::nullopt, 700));
  ASSERT_TRUE(wait_for([&] { return sub.status().batches_applied == 3; }));
  EXPECT_EQ(sub.status().restarts, 1u);
  EXPECT_EQ(matched(index, 100, 2), 1u);
  EXPECT_EQ(matched(index, 700, 1), 1u);
}

TEST_F(SubscriberTest, RankEndpoints) {
  EXPECT_EQ(*KvEventSubscriber::rank_endpoint("tcp://10.0.0.7:5557", 0), "tcp://10.0.0.7:5557");
  EXPECT_EQ(*KvEventSubscriber::rank_endpoint("tcp://10.0.0.7:5557", 3), "tcp://10.0.0.7:5560");
  EXPECT_EQ(*KvEventSubscriber::rank_endpoint("tcp://[::1]:5557", 1), "tcp://[::1]:5558");
  EXPECT_FALSE(KvEventSubscriber::rank_endpoint("ipc:///tmp/x", 1));
  EXPECT_FALSE(KvEventSubscriber::rank_endpoint("tcp://h:65535", 1));
  EXPECT_FALSE(KvEventSubscriber::rank_endpoint("tcp://h:abc", 1));
}

TEST_F(SubscriberTest, StartValidatesAndStopIsPrompt) {
  SubscriberOptions bad;
  bad.endpoint = "tcp://*:5557";
  KvEventSubscriber s1(index, bad);
  EXPECT_FALSE(s1.start());
  KvEventSubscriber s2(index, SubscriberOptions{});
  EXPECT_FALSE(s2.start());
  SubscriberOptions nobody;
  nobody.endpoint = "tcp://127.0.0.1:1";  // nothing listens: ZMQ keeps retrying in the background
  nobody.replay_endpoint = "tcp://127.0.0.1:2";
  KvEventSubscriber s3(index, nobody);
  ASSERT_TRUE(s3.start());
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(s3.live());
  const auto t0 = std::chrono::steady_clock::now();
  s3.stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
  s3.stop();  // idempotent
}

}  // namespace
}  // namespace kvroute::events
