// kvroute-sim's KV events, as a router receives them: subscribe with ZMQ, decode the msgpack batches
// (positional and map encodings) or the native protobuf stream (with the router's NativeDecoder), check
// BlockStored against /tokenize and /debug/kv_blocks, LoadReports against /metrics, and replay.
#include <gtest/gtest.h>

#include <zmq.h>

#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <boost/json/value.hpp>

#include <chrono>
#include <cstdlib>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "backends/events/native_events.h"
#include "proto/kv_events.pb.h"
#include "tests/sim_server/sim_process.h"

namespace kvroute::sim::testing {
namespace {

namespace json = boost::json;

std::vector<std::string> recv_multipart(void* socket, int timeout_ms) {
  std::vector<std::string> frames;
  zmq_pollitem_t item{socket, 0, ZMQ_POLLIN, 0};
  if (zmq_poll(&item, 1, timeout_ms) <= 0) return frames;
  int more = 1;
  while (more) {
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    if (zmq_msg_recv(&msg, socket, 0) < 0) {
      zmq_msg_close(&msg);
      break;
    }
    frames.emplace_back(static_cast<const char*>(zmq_msg_data(&msg)), zmq_msg_size(&msg));
    more = zmq_msg_more(&msg);
    zmq_msg_close(&msg);
  }
  return frames;
}

// A DEALER socket connected to the replay port that has asked for every batch from sequence 0 (an empty
// delimiter frame, then the 8-byte big-endian start); nullptr when it cannot connect.
void* request_replay_from_start(void* ctx, int replay_port) {
  void* dealer = zmq_socket(ctx, ZMQ_DEALER);
  int linger = 0;
  zmq_setsockopt(dealer, ZMQ_LINGER, &linger, sizeof linger);
  if (zmq_connect(dealer, ("tcp://127.0.0.1:" + std::to_string(replay_port)).c_str()) != 0) {
    zmq_close(dealer);
    return nullptr;
  }
  const std::string start(8, '\0');
  zmq_send(dealer, "", 0, ZMQ_SNDMORE);
  zmq_send(dealer, start.data(), start.size(), 0);
  return dealer;
}

std::int64_t be64(const std::string& s) {
  std::uint64_t v = 0;
  for (unsigned char c : s) v = (v << 8) | c;
  return static_cast<std::int64_t>(v);
}

// The prompt: 40 distinct words, so 2 full blocks of 16 tokens plus a tail (+ 1 output token).
std::string prompt_text(int attempt) {
  std::string s = "attempt" + std::to_string(attempt);
  for (int i = 1; i < 40; ++i) s += " w" + std::to_string(i);
  return s;
}

struct StoredEvent {
  std::vector<std::uint64_t> hashes;
  bool parent_nil = false;
  std::uint64_t parent = 0;
  std::vector<std::uint64_t> tokens;
  std::uint64_t block_size = 0;
  std::string medium;
  bool lora_id_nil = false;
};

// Decodes a batch in either encoding; returns the BlockStored events.
std::vector<StoredEvent> decode_batch(const std::string& payload, bool map_encoding) {
  Msg batch;
  EXPECT_TRUE(msgpack_decode(payload, batch));
  const Msg* events = nullptr;
  if (map_encoding) {
    EXPECT_NE(batch.get("ts"), nullptr);
    EXPECT_NE(batch.get("data_parallel_rank"), nullptr);
    events = batch.get("events");
  } else {
    EXPECT_EQ(batch.array().size(), 3u);
    EXPECT_TRUE(std::holds_alternative<double>(batch.array()[0].v));
    events = &batch.array()[1];
  }
  std::vector<StoredEvent> out;
  if (events == nullptr) return out;
  for (const Msg& e : events->array()) {
    StoredEvent s;
    if (map_encoding) {
      if (e.get("type")->str() != "BlockStored") continue;
      for (const Msg& h : e.get("block_hashes")->array()) s.hashes.push_back(h.bits());
      s.parent_nil = e.get("parent_block_hash")->is_nil();
      if (!s.parent_nil) s.parent = e.get("parent_block_hash")->bits();
      for (const Msg& t : e.get("token_ids")->array()) s.tokens.push_back(t.bits());
      s.block_size = e.get("block_size")->bits();
      s.medium = e.get("medium")->str();
      s.lora_id_nil = e.get("lora_id")->is_nil();
      EXPECT_NE(e.get("lora_name"), nullptr);
      EXPECT_EQ(e.get("extra_keys"), nullptr);  // default-valued keys are omitted
    } else {
      const auto& a = e.array();
      if (a[0].str() != "BlockStored") continue;
      EXPECT_GE(a.size(), 7u);
      for (const Msg& h : a[1].array()) s.hashes.push_back(h.bits());
      s.parent_nil = a[2].is_nil();
      if (!s.parent_nil) s.parent = a[2].bits();
      for (const Msg& t : a[3].array()) s.tokens.push_back(t.bits());
      s.block_size = a[4].bits();
      s.lora_id_nil = a[5].is_nil();
      s.medium = a[6].str();
    }
    out.push_back(std::move(s));
  }
  return out;
}

class SimKvEventsTest : public ::testing::TestWithParam<const char*> {};

TEST_P(SimKvEventsTest, BlockStoredMatchesTokensAndDebugEndpoint) {
  const std::string encoding = GetParam();
  const bool map_encoding = encoding == "map";
  const std::uint16_t events_port = free_port_range(2);
  SimProcess sim({"--speed", "100", "--kv-events-port", std::to_string(events_port), "--kv-events-replay-port",
                  std::to_string(events_port + 1), "--kv-events-encoding", encoding, "--kv-events-topic", "kv"});
  ASSERT_TRUE(sim.ready());

  void* ctx = zmq_ctx_new();
  void* sub = zmq_socket(ctx, ZMQ_SUB);
  int linger = 0;
  zmq_setsockopt(sub, ZMQ_LINGER, &linger, sizeof linger);
  zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "", 0);
  ASSERT_EQ(zmq_connect(sub, ("tcp://127.0.0.1:" + std::to_string(events_port)).c_str()), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // PUB/SUB: let the subscription arrive

  // PUB/SUB drops what is published before the subscription reaches the publisher; under load that can
  // take longer than the pause above, so each attempt uses a fresh prompt (fresh blocks, fresh events).
  std::vector<StoredEvent> stored;
  std::int64_t first_seq = -1;
  int attempt = 0;
  for (; attempt < 5 && stored.empty(); ++attempt) {
    const std::string body = json::serialize(json::object{{"prompt", prompt_text(attempt)}, {"max_tokens", 1}});
    ASSERT_EQ(http_call(sim.port(), "POST", "/v1/completions", body).status, 200);
    for (int i = 0; i < 4 && stored.empty(); ++i) {
      auto frames = recv_multipart(sub, 250);
      if (frames.empty()) continue;
      ASSERT_EQ(frames.size(), 3u);
      EXPECT_EQ(frames[0], "kv");
      ASSERT_EQ(frames[1].size(), 8u);
      first_seq = be64(frames[1]);
      stored = decode_batch(frames[2], map_encoding);
    }
  }
  --attempt;
  ASSERT_FALSE(stored.empty()) << "no BlockStored received";
  EXPECT_GE(first_seq, 0);  // replay below checks that the sequence starts at 0 and has no gaps

  // Collect every stored block of the request (one event may carry both blocks, or two events one each).
  std::vector<std::uint64_t> hashes;
  std::vector<std::uint64_t> tokens;
  for (const auto& s : stored) {
    EXPECT_EQ(s.block_size, 16u);
    EXPECT_EQ(s.medium, "GPU");
    EXPECT_TRUE(s.lora_id_nil);
    EXPECT_EQ(s.tokens.size(), 16 * s.hashes.size());
    hashes.insert(hashes.end(), s.hashes.begin(), s.hashes.end());
    tokens.insert(tokens.end(), s.tokens.begin(), s.tokens.end());
  }
  EXPECT_TRUE(stored.front().parent_nil);  // the chain's root block
  ASSERT_GE(hashes.size(), 2u);

  // token_ids are the prompt's tokens.
  json::value tok = json::parse(http_call(sim.port(), "POST", "/tokenize",
                                          json::serialize(json::object{{"prompt", prompt_text(attempt)}})).body);
  const auto& ids = tok.at("tokens").as_array();
  ASSERT_GE(ids.size(), 32u);
  for (std::size_t i = 0; i < 32; ++i) EXPECT_EQ(tokens[i], static_cast<std::uint64_t>(ids[i].as_int64())) << i;

  // The hashes (int64 on the wire) are the worker's own, as /debug/kv_blocks lists them (decimal uint64).
  json::value blocks = json::parse(http_call(sim.port(), "GET", "/debug/kv_blocks").body);
  std::set<std::string> held;
  for (const auto& h : blocks.at("gpu").as_array()) held.insert(std::string(h.as_string()));
  for (std::uint64_t h : hashes) EXPECT_TRUE(held.count(std::to_string(h))) << h;

  // Replay from 0: the same batch again, then the end marker.
  void* dealer = request_replay_from_start(ctx, events_port + 1);
  ASSERT_NE(dealer, nullptr);
  std::vector<std::int64_t> seqs;
  bool ended = false;
  for (int i = 0; i < 100 && !ended; ++i) {
    auto frames = recv_multipart(dealer, 2000);
    ASSERT_EQ(frames.size(), 3u);
    EXPECT_TRUE(frames[0].empty());
    const std::int64_t seq = be64(frames[1]);
    if (seq == -1) {
      EXPECT_TRUE(frames[2].empty());
      ended = true;
    } else {
      seqs.push_back(seq);
      if (seq == 0) {
        EXPECT_FALSE(decode_batch(frames[2], map_encoding).empty());
      }
    }
  }
  EXPECT_TRUE(ended);
  ASSERT_FALSE(seqs.empty());
  EXPECT_EQ(seqs.front(), 0);
  for (std::size_t i = 1; i < seqs.size(); ++i) EXPECT_EQ(seqs[i], seqs[i - 1] + 1);

  zmq_close(dealer);
  zmq_close(sub);
  zmq_ctx_term(ctx);
}

INSTANTIATE_TEST_SUITE_P(Encodings, SimKvEventsTest, ::testing::Values("positional", "map"));

// The value of the first sample of `name` (exact name, any labels) in Prometheus text; nullopt if absent.
std::optional<double> metric(const std::string& text, const std::string& name) {
  const auto pos = text.find("\n" + name + "{");
  if (pos == std::string::npos) return std::nullopt;
  const auto space = text.find("} ", pos);
  return std::strtod(text.c_str() + space + 2, nullptr);
}

// A label's value in the first sample of `name`.
std::string metric_label(const std::string& text, const std::string& name, const std::string& label) {
  const auto pos = text.find("\n" + name + "{");
  if (pos == std::string::npos) return {};
  const auto end = text.find('}', pos);
  const auto at = text.find(label + "=\"", pos);
  if (at == std::string::npos || at > end) return {};
  const auto begin = at + label.size() + 2;
  return text.substr(begin, text.find('"', begin) - begin);
}

// Applies a decoded native batch to a model of the worker's GPU blocks, as a router would.
void apply_to_model(const events::KvEventBatch& batch, std::set<std::uint64_t>& held) {
  for (const events::KvEvent& e : batch.events) {
    switch (e.type) {
      case events::KvEventType::kBlockStored:
        EXPECT_EQ(e.medium, events::Medium::kGpu);
        for (std::uint64_t h : batch.hashes_of(e)) held.insert(h);
        break;
      case events::KvEventType::kBlockRemoved:
        for (std::uint64_t h : batch.hashes_of(e)) EXPECT_EQ(held.erase(h), 1u) << "removed a block never stored";
        break;
      case events::KvEventType::kAllBlocksCleared:
        held.clear();
        break;
    }
  }
}

std::set<std::uint64_t> debug_gpu_blocks(std::uint16_t port) {
  json::value blocks = json::parse(http_call(port, "GET", "/debug/kv_blocks").body);
  std::set<std::uint64_t> out;
  for (const auto& h : blocks.at("gpu").as_array()) out.insert(std::stoull(std::string(h.as_string())));
  EXPECT_TRUE(blocks.at("cpu").as_array().empty());
  return out;
}

// --kv-events-format native: the same block events as the vLLM path in kvroute.v1.EventBatch payloads under
// the "kvroute.v1" topic, plus LoadReports; the router's decoder reads them, the stored / removed events
// reproduce /debug/kv_blocks exactly through evictions, a LoadReport of an idle worker equals /metrics, and
// the replay socket serves the same payloads.
TEST(SimNativeKvEvents, StreamMatchesDebugBlocksAndLoadMatchesMetrics) {
  const std::uint16_t events_port = free_port_range(2);
  SimProcess sim({"--speed", "100", "--num-gpu-blocks", "40", "--kv-events-port", std::to_string(events_port),
                  "--kv-events-replay-port", std::to_string(events_port + 1), "--kv-events-format", "native",
                  "--kv-events-load-interval", "0.2"});
  ASSERT_TRUE(sim.ready());

  void* ctx = zmq_ctx_new();
  void* sub = zmq_socket(ctx, ZMQ_SUB);
  int linger = 0;
  zmq_setsockopt(sub, ZMQ_LINGER, &linger, sizeof linger);
  zmq_setsockopt(sub, ZMQ_SUBSCRIBE, events::kNativeTopicPrefix.data(), events::kNativeTopicPrefix.size());
  ASSERT_EQ(zmq_connect(sub, ("tcp://127.0.0.1:" + std::to_string(events_port)).c_str()), 0);

  events::NativeDecoder dec;
  events::KvEventBatch batch;
  std::optional<events::WorkerTelemetry> load;
  std::optional<events::WorkerTelemetry> last_load;  // the newest LoadReport received
  v1::EventBatch raw;
  std::int64_t last_seq = -1;
  std::size_t stored_events = 0, removed_events = 0;
  std::set<std::uint64_t> held;
  // Receives one message and applies it; returns false on timeout.
  auto next = [&](int timeout_ms) {
    auto frames = recv_multipart(sub, timeout_ms);
    if (frames.empty()) return false;
    EXPECT_EQ(frames.size(), 3u);
    if (frames.size() != 3) return false;
    EXPECT_EQ(frames[0], "kvroute.v1");
    EXPECT_EQ(frames[1].size(), 8u);
    const std::int64_t seq = be64(frames[1]);
    if (last_seq >= 0) {
      EXPECT_EQ(seq, last_seq + 1) << "gap in the live stream";
    }
    last_seq = seq;
    const auto* p = reinterpret_cast<const std::uint8_t*>(frames[2].data());
    auto st = dec.decode({p, frames[2].size()}, events::DecodeLimits{}, batch, load);
    EXPECT_TRUE(st) << (st ? "" : st.error().message);
    EXPECT_TRUE(raw.ParseFromString(frames[2]));
    EXPECT_TRUE(raw.has_seq());
    EXPECT_EQ(raw.seq(), static_cast<std::uint64_t>(seq));  // the payload repeats the frame's sequence number
    if (load) last_load = load;
    for (const auto& e : batch.events) {
      if (e.type == events::KvEventType::kBlockStored) {
        ++stored_events;
        EXPECT_EQ(e.block_size, 16u);
        EXPECT_EQ(e.tokens_count, 16 * e.hashes_count);
        EXPECT_TRUE(e.lora_name.empty());
      } else if (e.type == events::KvEventType::kBlockRemoved) {
        ++removed_events;
      }
    }
    apply_to_model(batch, held);
    return true;
  };

  // The periodic LoadReport proves the subscription is in place before any block is stored, so the model
  // below sees every block event (PUB/SUB drops what precedes the subscription).
  bool subscribed = false;
  for (int i = 0; i < 50 && !subscribed; ++i) subscribed = next(200) && load.has_value() && batch.events.empty();
  ASSERT_TRUE(subscribed) << "no LoadReport heartbeat";
  EXPECT_EQ(load->engine, events::EngineKind::kNative);
  EXPECT_EQ(load->num_gpu_blocks, 40u);
  EXPECT_EQ(load->block_size, 16u);
  EXPECT_EQ(load->running, 0.0);

  // Eight distinct 128-token prompts (8 blocks + 1 output block each) into a 40-block pool: evictions.
  for (int r = 0; r < 8; ++r) {
    json::array prompt;
    for (int t = 0; t < 128; ++t) prompt.push_back(5000 + r * 1000 + t);
    const std::string body = json::serialize(json::object{{"prompt", prompt}, {"max_tokens", 4}});
    auto reply = http_call(sim.port(), "POST", "/v1/completions", body);
    ASSERT_EQ(reply.status, 200) << reply.body;
    while (next(0)) {
    }
  }
  // Every request has been answered, so the worker is idle: give its last events and at least one periodic
  // LoadReport time to arrive, then drain. The newest report is the idle worker's, which /metrics shows too.
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  last_load.reset();
  while (next(0)) {
  }
  ASSERT_TRUE(last_load.has_value()) << "no LoadReport within 0.7 s (interval 0.2 s)";
  const events::WorkerTelemetry idle_load = *last_load;
  EXPECT_EQ(idle_load.running, 0.0);
  EXPECT_EQ(idle_load.waiting, 0.0);

  EXPECT_GT(stored_events, 0u);
  EXPECT_GT(removed_events, 0u) << "the burst should have evicted";
  const std::set<std::uint64_t> truth = debug_gpu_blocks(sim.port());
  EXPECT_EQ(held, truth);
  EXPECT_GT(truth.size(), 20u);

  const std::string m = http_call(sim.port(), "GET", "/metrics").body;
  EXPECT_EQ(idle_load.running, metric(m, "vllm:num_requests_running"));
  EXPECT_EQ(idle_load.waiting, metric(m, "vllm:num_requests_waiting"));
  ASSERT_TRUE(metric(m, "vllm:kv_cache_usage_perc").has_value());
  EXPECT_NEAR(*idle_load.kv_usage, *metric(m, "vllm:kv_cache_usage_perc"), 1e-9);
  EXPECT_EQ(std::to_string(*idle_load.num_gpu_blocks), metric_label(m, "vllm:cache_config_info", "num_gpu_blocks"));
  EXPECT_EQ(std::to_string(*idle_load.block_size), metric_label(m, "vllm:cache_config_info", "block_size"));
  EXPECT_EQ(idle_load.prefix_cache_queries, metric(m, "vllm:prefix_cache_queries_total"));
  EXPECT_EQ(idle_load.prefix_cache_hits, metric(m, "vllm:prefix_cache_hits_total"));
  EXPECT_GT(*idle_load.prefix_cache_queries, 0.0);

  // Replay from 0: every batch since start, in order, each a native payload whose seq field repeats the
  // frame's; applied in order they give the same blocks.
  void* dealer = request_replay_from_start(ctx, events_port + 1);
  ASSERT_NE(dealer, nullptr);
  std::set<std::uint64_t> replayed;
  std::int64_t expect_seq = 0;
  bool ended = false;
  while (!ended) {
    auto frames = recv_multipart(dealer, 2000);
    ASSERT_EQ(frames.size(), 3u);
    EXPECT_TRUE(frames[0].empty());
    const std::int64_t seq = be64(frames[1]);
    if (seq == -1) {
      ended = true;
      continue;
    }
    ASSERT_EQ(seq, expect_seq++);
    const auto* p = reinterpret_cast<const std::uint8_t*>(frames[2].data());
    ASSERT_TRUE(dec.decode({p, frames[2].size()}, events::DecodeLimits{}, batch, load));
    ASSERT_TRUE(raw.ParseFromString(frames[2]));
    EXPECT_EQ(raw.seq(), static_cast<std::uint64_t>(seq));
    apply_to_model(batch, replayed);
  }
  EXPECT_GE(expect_seq - 1, last_seq);  // the buffer reaches at least as far as the live stream did
  EXPECT_EQ(replayed, truth);  // batches after the live stream's last can only be load reports (no traffic)

  zmq_close(dealer);
  zmq_close(sub);
  zmq_ctx_term(ctx);
}

}  // namespace
}  // namespace kvroute::sim::testing
