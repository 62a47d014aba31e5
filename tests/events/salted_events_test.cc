// A tenant's salted prompt in precise mode: vLLM sends the request's cache_salt in the first block's
// extra_keys; the decoders read it, the simulated worker sends it the same way, and the applier stores the
// chain in the salt's namespace (the one the router hashes that tenant's requests under), not the shared one.
#include <numeric>
#include <optional>

#include <gtest/gtest.h>

#include "backends/events/event_applier.h"
#include "backends/events/native_events.h"
#include "backends/events/vllm_events.h"
#include "backends/sim/server/kv_events.h"
#include "hashing/block_chain.h"
#include "tests/events/test_util.h"

namespace kvroute::events {
namespace {

using testing::hex;

std::vector<std::uint32_t> tokens(std::size_t n) {
  std::vector<std::uint32_t> t(n);
  std::iota(t.begin(), t.end(), 7);
  return t;
}

KvEventBatch decode(std::span<const std::uint8_t> payload) {
  KvEventBatch b;
  const auto st = decode_vllm_batch(payload, DecodeLimits{}, b);
  EXPECT_TRUE(st) << (st ? "" : st.error().message);
  return b;
}

std::span<const std::uint8_t> bytes(const std::string& s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

// [ts, [["BlockStored", [1], nil, [16 ids], 16, nil, "GPU", LORA, EXTRA]], 0] written by hand.
std::vector<std::uint8_t> positional_frame(std::string_view lora_hex, std::string_view extra_hex) {
  std::string f = "93 00 91 99 ab'BlockStored' 91 01 c0 dc 00 10";
  for (int i = 0; i < 16; ++i) f += " 07";
  f += " 10 c0 a3'GPU' ";
  f.append(lora_hex).append(" ").append(extra_hex).append(" 00");
  return hex(f);
}

TEST(SaltedEvents, VllmDecoderReadsTheFirstBlocksCacheSalt) {
  // extra_keys = [["tenant-salt"]]
  auto b = decode(positional_frame("c0", "91 91 ab'tenant-salt'"));
  ASSERT_EQ(b.events.size(), 1u);
  EXPECT_EQ(b.events[0].cache_salt, "tenant-salt");
  // With a LoRA: its name comes first in the extra keys; the salt is what follows.
  b = decode(positional_frame("a2'sq'", "91 92 a2'sq' a1's'"));
  EXPECT_EQ(b.events[0].lora_name, "sq");
  EXPECT_EQ(b.events[0].cache_salt, "s");
  // A LoRA request without salt: no salt.
  b = decode(positional_frame("a2'sq'", "91 91 a2'sq'"));
  EXPECT_EQ(b.events[0].cache_salt, "");
  // nil entries, and a multimodal key tuple (current vLLM: (identifier, offset)) before the salt.
  b = decode(positional_frame("c0", "91 c0"));
  EXPECT_EQ(b.events[0].cache_salt, "");
  b = decode(positional_frame("c0", "91 92 92 a3'img' 00 a1'x'"));
  EXPECT_EQ(b.events[0].cache_salt, "x");
  // Malformed extra keys are a decode error, not a guess.
  KvEventBatch bad;
  EXPECT_FALSE(decode_vllm_batch(positional_frame("c0", "91 05"), DecodeLimits{}, bad));
  EXPECT_FALSE(decode_vllm_batch(positional_frame("c0", "05"), DecodeLimits{}, bad));
}

// The simulated worker's three encodings carry the salt of a prompt's first block, and only of that block.
TEST(SaltedEvents, SimulatedWorkerSendsTheSaltAsVllmDoes) {
  const auto t = tokens(32);
  const std::vector<std::uint64_t> h = {11, 12};
  for (auto enc : {sim::KvEventEncoding::kPositional, sim::KvEventEncoding::kMap, sim::KvEventEncoding::kNative}) {
    sim::KvEventBatch batch(enc);
    batch.stored(h, std::nullopt, t, 16, "GPU", "", "kvr1-abc");
    batch.stored(std::span(h).subspan(1), 11, std::span(t).subspan(16), 16, "GPU", "", "kvr1-abc");
    batch.stored(h, std::nullopt, t, 16, "GPU", "lora-x", "kvr1-abc");
    const std::string payload = batch.encode(1.0, 0);
    KvEventBatch out;
    if (enc == sim::KvEventEncoding::kNative) {
      NativeDecoder d;
      std::optional<WorkerTelemetry> load;
      ASSERT_TRUE(d.decode(bytes(payload), DecodeLimits{}, out, load));
    } else {
      out = decode(bytes(payload));
    }
    ASSERT_EQ(out.events.size(), 3u);
    EXPECT_EQ(out.events[0].cache_salt, "kvr1-abc");
    EXPECT_EQ(out.events[1].cache_salt, "");  // not a prompt's first block
    EXPECT_EQ(out.events[2].cache_salt, "kvr1-abc");
    EXPECT_EQ(out.events[2].lora_name, "lora-x");
  }
}

TEST(SaltedEvents, EncoderAndDecodersRoundTripTheSalt) {
  const auto t = tokens(32);
  const std::vector<std::uint64_t> h = {1, 2};
  KvEventBatch in;
  in.add_stored(h, std::nullopt, t, 16, Medium::kGpu, "", "salt-1");
  in.add_stored(h, std::nullopt, t, 16, Medium::kCpu, "lora", "salt-2").group_idx = 0;
  in.add_stored(h, std::nullopt, t, 16).group_idx = 1;
  for (auto shape : {VllmShape::kArrayPositional, VllmShape::kArrayMapEvents, VllmShape::kMapMapEvents}) {
    const auto out = decode(encode_vllm_batch(in, shape));
    ASSERT_EQ(out.events.size(), 3u);
    EXPECT_EQ(out.events[0].cache_salt, "salt-1");
    EXPECT_EQ(out.events[1].cache_salt, "salt-2");
    EXPECT_EQ(out.events[1].lora_name, "lora");
    EXPECT_EQ(out.events[2].cache_salt, "");
    EXPECT_EQ(out.events[2].group_idx, 1);
  }
  KvEventBatch native;
  NativeDecoder d;
  std::optional<WorkerTelemetry> load;
  ASSERT_TRUE(d.decode(bytes(encode_native_batch(in)), DecodeLimits{}, native, load));
  EXPECT_EQ(native.events[1].cache_salt, "salt-2");
}

TEST(SaltedEvents, ApplierPlacesASaltedChainInTheSaltsNamespace) {
  hashing::PrefixIndex index;
  KvEventApplier applier(index, applier_options(1, "m"));
  const auto t = tokens(48);
  KvEventBatch b;
  const std::vector<std::uint64_t> h = {101, 102, 103};
  b.add_stored(std::span(h).first(2), std::nullopt, std::span(t).first(32), 16, Medium::kGpu, "", "kvr1-a");
  b.add_stored(std::span(h).subspan(2), 102, std::span(t).subspan(32), 16);  // continues the salted chain
  applier.apply(b);

  auto matched = [&](std::string_view salt) {
    hashing::PrefixIndex::Match m;
    index.match(hashing::hash_tokens(hashing::namespace_root("m", salt), t).hashes, m);
    return m.of(1);
  };
  EXPECT_EQ(matched("kvr1-a"), 3u);  // the tenant's own requests hit
  EXPECT_EQ(matched(""), 0u);        // the shared namespace does not
  EXPECT_EQ(matched("kvr1-b"), 0u);  // nor another tenant

  // Removing the engine's blocks removes the salted entries.
  KvEventBatch r;
  r.add_removed(h);
  applier.apply(r);
  EXPECT_EQ(matched("kvr1-a"), 0u);
}

}  // namespace
}  // namespace kvroute::events
