// vLLM KV-event batches in all three wire shapes (architecture section 9), written byte by byte from the
// msgpack spec, plus the strictness rules: malformed, oversized and truncated frames are errors, never crashes.
#include "backends/events/vllm_events.h"

#include <gtest/gtest.h>

#include <random>

#include "backends/events/msgpack.h"
#include "tests/events/test_util.h"

namespace kvroute::events {
namespace {

using testing::hex;

// Shape 1 (vLLM <= 0.23): [ts, [event...], dp_rank], each event positional with its tag first.
// BlockStored with block_size 2: hashes [1, 2], no parent, tokens [10, 11, 12, 13], lora_id nil, "GPU",
// lora_name nil; extra_keys, group_idx and the spec fields are at their defaults and omitted.
const char* kShape1 =
    "93 cb 3f f8 00 00 00 00 00 00"                     // [1.5,
    "  93"                                              //  [ three events
    "    98 ab 'BlockStored' 92 01 02 c0 94 0a 0b 0c 0d 02 c0 a3 'GPU' c0"
    "    93 ac 'BlockRemoved' 91 01 a3 'CPU'"
    "    91 b0 'AllBlocksCleared'"
    "  00";                                             //  dp rank 0]

TEST(VllmDecoder, PositionalArrayBatch) {
  auto b = hex(kShape1);
  KvEventBatch batch;
  auto st = decode_vllm_batch(b, DecodeLimits{}, batch);
  ASSERT_TRUE(st) << st.error().message;
  EXPECT_EQ(batch.ts, 1.5);
  EXPECT_EQ(batch.data_parallel_rank, 0);
  ASSERT_EQ(batch.events.size(), 3u);
  const KvEvent& s = batch.events[0];
  EXPECT_EQ(s.type, KvEventType::kBlockStored);
  EXPECT_FALSE(s.has_parent);
  EXPECT_EQ(s.block_size, 2u);
  EXPECT_EQ(s.medium, Medium::kGpu);
  EXPECT_TRUE(s.lora_name.empty());
  EXPECT_EQ(s.group_idx, 0);
  EXPECT_EQ(std::vector<std::uint64_t>(batch.hashes_of(s).begin(), batch.hashes_of(s).end()),
            (std::vector<std::uint64_t>{1, 2}));
  EXPECT_EQ(std::vector<std::uint32_t>(batch.tokens_of(s).begin(), batch.tokens_of(s).end()),
            (std::vector<std::uint32_t>{10, 11, 12, 13}));
  const KvEvent& r = batch.events[1];
  EXPECT_EQ(r.type, KvEventType::kBlockRemoved);
  EXPECT_EQ(r.medium, Medium::kCpu);
  ASSERT_EQ(r.hashes_count, 1u);
  EXPECT_EQ(batch.hashes_of(r)[0], 1u);
  EXPECT_EQ(batch.events[2].type, KvEventType::kAllBlocksCleared);
}

TEST(VllmDecoder, TrailingDefaultsMayBeOmitted) {
  // [ts, events] without the rank; an old 5-field BlockStored (no medium, no lora_name) whose hash is a
  // uint64 above INT64_MAX and whose parent is a negative int64; BlockRemoved with just its hashes;
  // BlockStored with every field present including group_idx 1 and the sliding-window spec.
  auto b = hex(
      "92 cb 00 00 00 00 00 00 00 00"
      "  93"
      "    96 ab 'BlockStored' 91 cf ff ff ff ff ff ff ff f0 d3 ff ff ff ff ff ff ff fe 92 07 08 02 c0"
      "    92 ac 'BlockRemoved' 91 cf ff ff ff ff ff ff ff f0"
      "    9c ab 'BlockStored' 91 05 06 92 01 02 02 c0 a3 'CPU' a3 'ad1' 91 c0 01 ae 'sliding_window' cd 10 00");
  KvEventBatch batch;
  auto st = decode_vllm_batch(b, DecodeLimits{}, batch);
  ASSERT_TRUE(st) << st.error().message;
  EXPECT_EQ(batch.data_parallel_rank, -1);
  ASSERT_EQ(batch.events.size(), 3u);
  const KvEvent& old = batch.events[0];
  EXPECT_EQ(batch.hashes_of(old)[0], 0xfffffffffffffff0ull);
  EXPECT_TRUE(old.has_parent);
  EXPECT_EQ(old.parent_block_hash, 0xfffffffffffffffeull);  // -2 as bits
  EXPECT_EQ(old.medium, Medium::kGpu);                      // absent medium: GPU
  EXPECT_EQ(batch.events[1].medium, Medium::kGpu);
  const KvEvent& full = batch.events[2];
  EXPECT_EQ(full.medium, Medium::kCpu);
  EXPECT_EQ(full.lora_name, "ad1");
  EXPECT_EQ(full.group_idx, 1);
  EXPECT_EQ(full.parent_block_hash, 6u);
}

TEST(VllmDecoder, MapEventsInArrayBatch) {
  // Shape 2 (vLLM 0.26): array batch, map events with "type"; keys in an unusual order and an unknown key.
  auto b = hex(
      "93 cb 40 00 00 00 00 00 00 00"
      "  92"
      "    89 a4 'type' ab 'BlockStored'"
      "       ac 'block_hashes' 92 0b 0c"
      "       b1 'parent_block_hash' 0a"
      "       a9 'token_ids' 94 01 02 03 04"
      "       aa 'block_size' 02"
      "       a7 'lora_id' c0"
      "       a6 'medium' a3 'GPU'"
      "       a9 'lora_name' c0"
      "       a9 'new_field' 92 c3 c2"
      "    83 a6 'medium' c0 ac 'block_hashes' 91 0b a4 'type' ac 'BlockRemoved'"
      "  c0");
  KvEventBatch batch;
  auto st = decode_vllm_batch(b, DecodeLimits{}, batch);
  ASSERT_TRUE(st) << st.error().message;
  EXPECT_EQ(batch.ts, 2.0);
  EXPECT_EQ(batch.data_parallel_rank, -1);  // nil
  ASSERT_EQ(batch.events.size(), 2u);
  EXPECT_EQ(batch.events[0].type, KvEventType::kBlockStored);
  EXPECT_TRUE(batch.events[0].has_parent);
  EXPECT_EQ(batch.events[0].parent_block_hash, 10u);
  EXPECT_EQ(batch.events[0].tokens_count, 4u);
  EXPECT_EQ(batch.events[1].type, KvEventType::kBlockRemoved);
  EXPECT_EQ(batch.hashes_of(batch.events[1])[0], 11u);
}

TEST(VllmDecoder, MapBatchWithDefaultKeysOmitted) {
  // Shape 3 (current vLLM): {"ts", "events", "data_parallel_rank"}; BlockStored without lora_id,
  // lora_name, extra_keys, group_idx (defaults), medium absent too.
  auto b = hex(
      "83 a2 'ts' cb 40 00 00 00 00 00 00 00"
      "   a6 'events' 92"
      "     85 a4 'type' ab 'BlockStored' ac 'block_hashes' 91 2a b1 'parent_block_hash' c0"
      "        a9 'token_ids' 92 05 06 aa 'block_size' 02"
      "     81 a4 'type' b0 'AllBlocksCleared'"
      "   b2 'data_parallel_rank' 03");
  KvEventBatch batch;
  auto st = decode_vllm_batch(b, DecodeLimits{}, batch);
  ASSERT_TRUE(st) << st.error().message;
  EXPECT_EQ(batch.data_parallel_rank, 3);
  ASSERT_EQ(batch.events.size(), 2u);
  EXPECT_EQ(batch.events[0].medium, Medium::kGpu);
  EXPECT_FALSE(batch.events[0].has_parent);
  EXPECT_EQ(batch.events[1].type, KvEventType::kAllBlocksCleared);
  // The rank is optional in the map too.
  auto minimal = hex("81 a6 'events' 90");
  ASSERT_TRUE(decode_vllm_batch(minimal, DecodeLimits{}, batch));
  EXPECT_TRUE(batch.events.empty());
}

TEST(VllmDecoder, BytesHashesAreReducedDeterministically) {
  std::vector<std::uint8_t> h1(32), h2(32);
  for (int i = 0; i < 32; ++i) {
    h1[i] = static_cast<std::uint8_t>(i);
    h2[i] = static_cast<std::uint8_t>(100 + i);
  }
  MsgpackWriter w;
  w.array(3).f64(0).array(1).array(8).str("BlockStored").array(1).bin(h2).bin(h1).array(2).u64(1).u64(2).u64(2)
      .nil().str("GPU").nil().u64(0);
  KvEventBatch batch;
  auto st = decode_vllm_batch(w.bytes(), DecodeLimits{}, batch);
  ASSERT_TRUE(st) << st.error().message;
  EXPECT_EQ(batch.hashes_of(batch.events[0])[0], engine_hash_of_bytes(h2));
  EXPECT_EQ(batch.events[0].parent_block_hash, engine_hash_of_bytes(h1));
  EXPECT_NE(engine_hash_of_bytes(h1), engine_hash_of_bytes(h2));
}

TEST(VllmDecoder, UnknownEventTypesAreSkippedNotFatal) {
  auto b = hex("92 00 93  93 ab 'NewEventXyz' 01 02  81 a4 'type' a3 'Foo'  91 b0 'AllBlocksCleared'");
  KvEventBatch batch;
  auto st = decode_vllm_batch(b, DecodeLimits{}, batch);
  ASSERT_TRUE(st) << st.error().message;
  EXPECT_EQ(batch.skipped_events, 2u);
  ASSERT_EQ(batch.events.size(), 1u);
}

TEST(VllmDecoder, MalformedFramesAreErrors) {
  const char* bad[] = {
      "94 00 90 00 00",                                               // batch of 4 elements
      "91 00",                                                        // batch of 1 element
      "92 a1 'x' 90",                                                 // ts is a string
      "92 00 91 05",                                                  // event is an int
      "92 00 91 90",                                                  // empty event array
      "92 00 91 95 ab 'BlockStored' 91 01 c0 93 01 02 03 02",         // 3 tokens for 1 block of 2
      "92 00 91 95 ab 'BlockStored' 91 cb 00 00 00 00 00 00 00 00 c0 92 01 02 02",  // float hash
      "92 00 91 95 ab 'BlockStored' 91 01 c0 92 01 02 00",            // block_size 0
      "92 00 91 95 ab 'BlockStored' 91 01 c0 92 ff 02 02",            // negative token id
      "92 00 91 95 ab 'BlockStored' 91 01 c0 92 cf 00 00 00 01 00 00 00 00 02 02",  // token > uint32
      "92 00 91 92 b0 'AllBlocksCleared' 01",                         // cleared with a field
      "92 00 91 95 ac 'BlockRemoved' 91 01 c0 00 00",                 // removed with 4 fields
      "92 00 91 81 ac 'block_hashes' 90",                             // map event without type
      "92 00 91 82 a4 'type' ab 'BlockStored' ac 'block_hashes' 90",  // stored without tokens
      "81 a2 'ts' 00",                                                // map batch without events
      "92 00 90 c0",                                                  // trailing bytes
      "92 00 91 98 ab 'BlockStored' 91 01 c0 92 01 02 02 c0 a3 'GPU' 05",  // lora_name is an int
      "a5 'hello'",                                                   // not a batch
  };
  for (const char* b : bad) {
    auto bytes = hex(b);
    KvEventBatch batch;
    auto st = decode_vllm_batch(bytes, DecodeLimits{}, batch);
    EXPECT_FALSE(st) << b;
    if (!st) {
      EXPECT_FALSE(st.error().message.empty());
    }
  }
}

TEST(VllmDecoder, SizeLimitsAreEnforced) {
  KvEventBatch batch;
  batch.ts = 1;
  KvEvent e;
  e.type = KvEventType::kBlockStored;
  e.block_size = 4;
  e.hashes_count = 8;
  e.tokens_count = 32;
  for (int i = 0; i < 8; ++i) batch.block_hashes.push_back(i);
  for (int i = 0; i < 32; ++i) batch.token_ids.push_back(i);
  batch.events.push_back(e);
  auto bytes = encode_vllm_batch(batch, VllmShape::kArrayPositional);
  KvEventBatch out;
  ASSERT_TRUE(decode_vllm_batch(bytes, DecodeLimits{}, out));
  DecodeLimits l;
  l.max_frame_bytes = bytes.size() - 1;
  EXPECT_FALSE(decode_vllm_batch(bytes, l, out));
  l = DecodeLimits{};
  l.max_blocks_per_event = 7;
  EXPECT_FALSE(decode_vllm_batch(bytes, l, out));
  l = DecodeLimits{};
  l.max_tokens_per_event = 31;
  EXPECT_FALSE(decode_vllm_batch(bytes, l, out));
  l = DecodeLimits{};
  l.max_block_size = 3;
  EXPECT_FALSE(decode_vllm_batch(bytes, l, out));
  l = DecodeLimits{};
  l.max_events_per_batch = 0;
  EXPECT_FALSE(decode_vllm_batch(bytes, l, out));
}

KvEventBatch sample_batch() {
  KvEventBatch b;
  b.ts = 12.5;
  b.data_parallel_rank = 1;
  auto stored = [&](std::vector<std::uint64_t> hs, std::optional<std::uint64_t> parent, Medium m,
                    std::string lora, std::int64_t group) {
    KvEvent e;
    e.type = KvEventType::kBlockStored;
    e.block_size = 16;
    e.hashes_begin = static_cast<std::uint32_t>(b.block_hashes.size());
    e.hashes_count = static_cast<std::uint32_t>(hs.size());
    b.block_hashes.insert(b.block_hashes.end(), hs.begin(), hs.end());
    e.tokens_begin = static_cast<std::uint32_t>(b.token_ids.size());
    e.tokens_count = static_cast<std::uint32_t>(hs.size() * 16);
    for (std::uint32_t i = 0; i < e.tokens_count; ++i) b.token_ids.push_back(1000 + i * 7);
    e.has_parent = parent.has_value();
    e.parent_block_hash = parent.value_or(0);
    e.medium = m;
    e.lora_name = std::move(lora);
    e.group_idx = group;
    b.events.push_back(e);
  };
  stored({1, 2, 3}, std::nullopt, Medium::kGpu, "", 0);
  stored({4}, 3, Medium::kCpu, "adapter", 0);
  stored({5}, 4, Medium::kGpu, "", 2);
  KvEvent r;
  r.type = KvEventType::kBlockRemoved;
  r.hashes_begin = static_cast<std::uint32_t>(b.block_hashes.size());
  r.hashes_count = 2;
  b.block_hashes.push_back(2);
  b.block_hashes.push_back(0xffffffffffffffffull);
  r.medium = Medium::kCpu;
  b.events.push_back(r);
  KvEvent c;
  c.type = KvEventType::kAllBlocksCleared;
  b.events.push_back(c);
  return b;
}

void expect_same(const KvEventBatch& a, const KvEventBatch& b) {
  EXPECT_EQ(a.ts, b.ts);
  EXPECT_EQ(a.data_parallel_rank, b.data_parallel_rank);
  ASSERT_EQ(a.events.size(), b.events.size());
  for (std::size_t i = 0; i < a.events.size(); ++i) {
    const KvEvent& x = a.events[i];
    const KvEvent& y = b.events[i];
    EXPECT_EQ(x.type, y.type) << i;
    EXPECT_EQ(x.medium, y.medium) << i;
    EXPECT_EQ(x.has_parent, y.has_parent) << i;
    if (x.has_parent) {
      EXPECT_EQ(x.parent_block_hash, y.parent_block_hash) << i;
    }
    EXPECT_EQ(x.lora_name, y.lora_name) << i;
    EXPECT_EQ(x.group_idx, y.group_idx) << i;
    EXPECT_TRUE(std::ranges::equal(a.hashes_of(x), b.hashes_of(y))) << i;
    EXPECT_TRUE(std::ranges::equal(a.tokens_of(x), b.tokens_of(y))) << i;
    if (x.type == KvEventType::kBlockStored) {
      EXPECT_EQ(x.block_size, y.block_size) << i;
    }
  }
}

TEST(VllmDecoder, EncoderRoundTripsAllShapes) {
  const KvEventBatch in = sample_batch();
  for (VllmShape shape : {VllmShape::kArrayPositional, VllmShape::kArrayMapEvents, VllmShape::kMapMapEvents}) {
    auto bytes = encode_vllm_batch(in, shape);
    KvEventBatch out;
    auto st = decode_vllm_batch(bytes, DecodeLimits{}, out);
    ASSERT_TRUE(st) << static_cast<int>(shape) << ": " << st.error().message;
    expect_same(in, out);
  }
}

TEST(VllmDecoder, EveryTruncationAndMutationIsHandled) {
  const KvEventBatch in = sample_batch();
  std::mt19937 rng(7);
  for (VllmShape shape : {VllmShape::kArrayPositional, VllmShape::kArrayMapEvents, VllmShape::kMapMapEvents}) {
    const auto bytes = encode_vllm_batch(in, shape);
    KvEventBatch out;
    for (std::size_t n = 0; n < bytes.size(); ++n) {
      std::span<const std::uint8_t> prefix(bytes.data(), n);
      EXPECT_FALSE(decode_vllm_batch(prefix, DecodeLimits{}, out)) << n;
    }
    // Random byte flips: any outcome is fine as long as it is a value (sanitizers check memory safety).
    for (int i = 0; i < 3000; ++i) {
      auto m = bytes;
      const int flips = 1 + static_cast<int>(rng() % 4);
      for (int f = 0; f < flips; ++f) m[rng() % m.size()] = static_cast<std::uint8_t>(rng());
      auto st = decode_vllm_batch(m, DecodeLimits{}, out);
      if (st) {
        for (const KvEvent& e : out.events) {
          ASSERT_LE(e.hashes_begin + e.hashes_count, out.block_hashes.size());
          ASSERT_LE(e.tokens_begin + e.tokens_count, out.token_ids.size());
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvroute::events
