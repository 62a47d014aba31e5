// The native protobuf stream: round trip through the schema, load reports, bounds, and equivalence with the
// vLLM msgpack path once applied.
#include "backends/events/native_events.h"

#include <gtest/gtest.h>

#include <numeric>

#include "backends/events/event_applier.h"
#include "backends/events/vllm_events.h"
#include "proto/kv_events.pb.h"
#include "tests/events/test_util.h"

namespace kvroute::events {
namespace {

using testing::hex;

KvEventBatch sample() {
  KvEventBatch b;
  b.ts = 3.25;
  b.data_parallel_rank = 2;
  std::vector<std::uint32_t> t(48);
  std::iota(t.begin(), t.end(), 7u);
  const std::uint64_t h1[] = {0xfffffffffffffff1ull, 2};
  const std::uint64_t h2[] = {3};
  b.add_stored(h1, std::nullopt, std::span<const std::uint32_t>(t).first(32), 16);
  b.add_stored(h2, 2, std::span<const std::uint32_t>(t).subspan(32), 16, Medium::kCpu, "lora-a");
  const std::uint64_t r[] = {2};
  b.add_removed(r, Medium::kCpu);
  b.add_cleared();
  return b;
}

TEST(NativeEvents, RoundTrip) {
  const KvEventBatch in = sample();
  WorkerTelemetry load;
  load.running = 3;
  load.waiting = 4;
  load.kv_usage = 0.5;
  load.num_gpu_blocks = 1000;
  load.block_size = 16;
  const std::string bytes = encode_native_batch(in, &load, 42);
  NativeDecoder dec;
  KvEventBatch out;
  std::optional<WorkerTelemetry> got;
  auto st = dec.decode({reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()}, DecodeLimits{}, out, got);
  ASSERT_TRUE(st) << st.error().message;
  EXPECT_EQ(out.ts, 3.25);
  EXPECT_EQ(out.data_parallel_rank, 2);
  ASSERT_EQ(out.events.size(), 4u);
  EXPECT_FALSE(out.events[0].has_parent);
  EXPECT_EQ(out.hashes_of(out.events[0])[0], 0xfffffffffffffff1ull);
  EXPECT_TRUE(out.events[1].has_parent);
  EXPECT_EQ(out.events[1].parent_block_hash, 2u);
  EXPECT_EQ(out.events[1].medium, Medium::kCpu);
  EXPECT_EQ(out.events[1].lora_name, "lora-a");
  EXPECT_TRUE(std::ranges::equal(in.tokens_of(in.events[1]), out.tokens_of(out.events[1])));
  EXPECT_EQ(out.events[2].type, KvEventType::kBlockRemoved);
  EXPECT_EQ(out.events[3].type, KvEventType::kAllBlocksCleared);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->engine, EngineKind::kNative);
  EXPECT_EQ(*got->running, 3);
  EXPECT_EQ(*got->waiting, 4);
  EXPECT_EQ(*got->kv_usage, 0.5);
  EXPECT_EQ(*got->num_gpu_blocks, 1000u);
  EXPECT_EQ(*got->block_size, 16u);
  v1::EventBatch raw;
  ASSERT_TRUE(raw.ParseFromString(bytes));
  EXPECT_EQ(raw.seq(), 42u);
}

TEST(NativeEvents, HandWrittenWireBytes) {
  // EventBatch{ts: 1.0, events: [{cleared: {}}]}: field 1 fixed64 (tag 0x09), field 2 length-delimited
  // (0x12) holding Event{cleared (field 3, 0x1a) of length 0}.
  auto bytes = hex("09 00 00 00 00 00 00 f0 3f  12 02 1a 00");
  NativeDecoder dec;
  KvEventBatch out;
  std::optional<WorkerTelemetry> load;
  auto st = dec.decode(bytes, DecodeLimits{}, out, load);
  ASSERT_TRUE(st) << st.error().message;
  EXPECT_EQ(out.ts, 1.0);
  ASSERT_EQ(out.events.size(), 1u);
  EXPECT_EQ(out.events[0].type, KvEventType::kAllBlocksCleared);
  EXPECT_FALSE(load.has_value());
}

TEST(NativeEvents, InvalidPayloadsAreErrors) {
  NativeDecoder dec;
  KvEventBatch out;
  std::optional<WorkerTelemetry> load;
  auto garbage = hex("ff ff ff ff ff");
  EXPECT_FALSE(dec.decode(garbage, DecodeLimits{}, out, load));
  // BlockStored whose token ids do not cover its blocks: field 2 -> Event{stored{block_hashes [1],
  // token_ids [5], block_size 16}}.
  auto short_tokens = hex("12 0a 0a 08 0a 01 01 1a 01 05 20 10");
  auto st = dec.decode(short_tokens, DecodeLimits{}, out, load);
  EXPECT_FALSE(st);
  const KvEventBatch in = sample();
  const std::string bytes = encode_native_batch(in);
  DecodeLimits l;
  l.max_frame_bytes = bytes.size() - 1;
  EXPECT_FALSE(dec.decode({reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()}, l, out, load));
  l = DecodeLimits{};
  l.max_blocks_per_event = 1;
  EXPECT_FALSE(dec.decode({reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()}, l, out, load));
}

TEST(NativeEvents, AppliesLikeTheVllmStream) {
  const KvEventBatch in = sample();
  KvEventBatch stored_only;
  stored_only.events.assign(in.events.begin(), in.events.begin() + 3);
  stored_only.block_hashes = in.block_hashes;
  stored_only.token_ids = in.token_ids;
  const std::string pb = encode_native_batch(stored_only);
  const auto mp = encode_vllm_batch(stored_only, VllmShape::kMapMapEvents);

  hashing::PrefixIndex a, b;
  KvEventApplier apply_a(a, applier_options(0, "m"));
  KvEventApplier apply_b(b, applier_options(0, "m"));
  NativeDecoder dec;
  KvEventBatch x, y;
  std::optional<WorkerTelemetry> load;
  ASSERT_TRUE(dec.decode({reinterpret_cast<const std::uint8_t*>(pb.data()), pb.size()}, DecodeLimits{}, x, load));
  ASSERT_TRUE(decode_vllm_batch(mp, DecodeLimits{}, y));
  apply_a.apply(x);
  apply_b.apply(y);
  auto ha = a.worker_hashes(0);
  auto hb = b.worker_hashes(0);
  std::ranges::sort(ha);
  std::ranges::sort(hb);
  EXPECT_EQ(ha, hb);
  // Three blocks stored; the CPU removal names a block held only on GPU, so it removes nothing.
  EXPECT_EQ(ha.size(), 3u);
}

}  // namespace
}  // namespace kvroute::events
