// Unit tests of the shared state's wire formats (backends/shared_state/wire.h) and of its queue while Redis is
// away; the Redis side is tested end to end with a real redis-server (tests/e2e/replicas_e2e_test.cc).
#include <gtest/gtest.h>

#include <vector>

#include "backends/shared_state/shared_state.h"
#include "backends/shared_state/wire.h"

namespace kvroute::shared_state {
namespace {

TEST(SharedStateUrl, ParsesHostPortPasswordAndDb) {
  auto u = parse_redis_url("redis://:s3cret@10.0.0.5:6380/2");
  ASSERT_TRUE(u) << u.error().message;
  EXPECT_EQ(u->host, "10.0.0.5");
  EXPECT_EQ(u->port, 6380);
  EXPECT_EQ(u->password, "s3cret");
  EXPECT_EQ(u->user, "");
  EXPECT_EQ(u->db, 2);
  EXPECT_EQ(u->display(), "redis://10.0.0.5:6380/2");  // never the password
  auto acl = parse_redis_url("redis://router:pw@redis");
  ASSERT_TRUE(acl);
  EXPECT_EQ(acl->user, "router");
  EXPECT_EQ(acl->port, 6379);
  EXPECT_TRUE(parse_redis_url("redis://[::1]:7000"));
}

TEST(SharedStateUrl, BadUrlsSayWhyWithoutThePassword) {
  for (const char* bad : {"http://h:1", "redis://:pw@h:99999", "redis://", "redis://h:1/x", "redis://pw@h:1"}) {
    auto u = parse_redis_url(bad);
    ASSERT_FALSE(u) << bad;
    EXPECT_NE(u.error().message.find("redis://"), std::string::npos);
    EXPECT_EQ(u.error().message.find("pw@"), std::string::npos) << u.error().message;
  }
}

TEST(SharedStateWire, HashesRoundTrip) {
  const std::vector<hashing::BlockHash> h{0, 1, 0xfedcba9876543210ull, ~0ull};
  const std::string packed = wire::pack_hashes(h);
  EXPECT_EQ(packed.size(), 32u);
  // Little-endian on the wire, whatever the host: replicas on different machines read each other's records.
  EXPECT_EQ(packed[8], '\x01');
  EXPECT_EQ(packed.substr(16, 8), std::string("\x10\x32\x54\x76\x98\xba\xdc\xfe", 8));
  EXPECT_EQ(wire::unpack_hashes(packed), h);
  EXPECT_EQ(wire::parse_hex64(wire::hex64(0xfedcba9876543210ull)), 0xfedcba9876543210ull);
  EXPECT_FALSE(wire::parse_hex64("xyz"));
}

TEST(SharedStateWire, LoadsAreSummedPerWorker) {
  std::vector<WorkerLoad> sum;
  wire::add_load(wire::pack_load({{"http://a:1", 2, 100, 0.5, 0.3, 40}, {"http://b:1", 1, 0, 0, 0, 7}}), sum);
  wire::add_load(wire::pack_load({{"http://a:1", 3, 50, 0.25, 0.4, 10}}), sum);
  wire::add_load("garbage line\nhttp://c:1\t1\n", sum);  // malformed lines are skipped
  ASSERT_EQ(sum.size(), 2u);
  EXPECT_EQ(sum[0].worker, "http://a:1");
  EXPECT_EQ(sum[0].in_flight, 5u);
  EXPECT_EQ(sum[0].pending_prefill_tokens, 150u);
  EXPECT_DOUBLE_EQ(sum[0].pending_prefill_s, 0.75);
  EXPECT_DOUBLE_EQ(sum[0].oldest_prefill_s, 0.4);
  EXPECT_EQ(sum[0].active_decode_tokens, 50u);
  EXPECT_EQ(sum[1].in_flight, 1u);
}

// The time a replica's prefill queue on a worker has gone without a first token (kv_cost's credit for a long
// prefill's progress): the largest of the replicas' counts, and it grows as the share ages while prefill is left.
// A replica of the version before sends six fields, which still count (without it).
TEST(SharedStateWire, TheLongestWaitWithoutAFirstTokenIsShared) {
  std::vector<WorkerLoad> sum;
  wire::add_load(wire::pack_load({{"http://a:1", 1, 30000, 1.5, 1.5, 0, 0, 0.8}}), sum);
  wire::add_load(wire::pack_load({{"http://a:1", 1, 20000, 1.0, 1.0, 0, 0, 0.3}}), sum);
  wire::add_load("http://a:1\t1\t10000\t0.5\t0.5\t0\n", sum);
  ASSERT_EQ(sum.size(), 1u);
  EXPECT_EQ(sum[0].in_flight, 3u);
  EXPECT_DOUBLE_EQ(sum[0].prefill_elapsed_s, 0.8);
  policy::LoadShare share = sum[0].share();
  share.drain(0.1);
  EXPECT_NEAR(share.prefill_elapsed_s, 0.9, 1e-12);
  policy::WorkerView v;
  v.prefill_elapsed_s = 0.2;  // this replica's own
  share.add_to(v);
  EXPECT_NEAR(v.prefill_elapsed_s, 0.9, 1e-12);
}

// The KV tokens the replicas' requests in flight will hold (kv_cost's admission: what the pool frees as they end)
// are summed over replicas and records and stay while the prefill drains; loads and records from replicas of the
// version before (seven and two fields) still count, without them.
TEST(SharedStateWire, TheKvTokensInFlightAreSummedOverReplicas) {
  std::vector<WorkerLoad> sum;
  wire::add_load(wire::pack_load({{"http://a:1", 2, 1000, 0.1, 0.1, 0, 0, 0.05, 9000}}), sum);
  wire::add_load("http://a:1\t1\t500\t0.05\t0.05\t0\t0.01\n", sum);
  const auto record = wire::unpack_share(wire::pack_share(policy::LoadShare{1, 4096, 0, 0.25, 0, 0, 4352}));
  ASSERT_TRUE(record);
  EXPECT_EQ(record->inflight_kv_tokens, 4352u);
  const auto old_record = wire::unpack_share("4096\t0.25");
  ASSERT_TRUE(old_record);
  EXPECT_EQ(old_record->inflight_kv_tokens, 0u);
  EXPECT_FALSE(wire::unpack_share("4096\t0.25\tx"));
  ASSERT_EQ(sum.size(), 1u);
  EXPECT_EQ(sum[0].in_flight, 3u);
  EXPECT_EQ(sum[0].inflight_kv_tokens, 9000u);
  policy::LoadShare share = sum[0].share();
  share.add(*record);
  share.drain(10.0);  // the prefill is done; the requests are still in flight
  policy::WorkerView v;
  v.inflight_kv_tokens = 1000;  // this replica's own
  share.add_to(v);
  EXPECT_EQ(v.inflight_kv_tokens, 14352u);
  EXPECT_EQ(v.pending_prefill_tokens, 0u);
}

// What the router is handed: per worker, every replica's published load and routed records, as one queue drained
// to the time it is handed on (policy::queued_at).
TEST(SharedStateWire, TheOthersLoadDrainsAsOneQueuePerWorker) {
  const std::vector<WorkerLoad> parts{{"http://a:1", 2, 2000, 0.020, 0.010, 40, 10.000},  // a replica's load
                                      {"http://a:1", 1, 1000, 0.010, 0, 0, 10.030},       // a record, later
                                      {"http://b:1", 1, 500, 0.005, 0.005, 0, 10.000}};
  const auto sum = wire::queued_at(parts, 10.035);
  ASSERT_EQ(sum.size(), 2u);
  EXPECT_EQ(sum[0].worker, "http://a:1");
  EXPECT_EQ(sum[0].in_flight, 3u);
  EXPECT_NEAR(sum[0].pending_prefill_s, 0.005, 1e-9);  // the first 20 ms done by 10.030, then 5 of the record's 10
  EXPECT_EQ(sum[0].pending_prefill_tokens, 500u);
  EXPECT_EQ(sum[0].active_decode_tokens, 40u);
  EXPECT_DOUBLE_EQ(sum[0].at, 10.035);
  EXPECT_EQ(sum[1].pending_prefill_s, 0.0);  // b's prefill was done at 10.005
  EXPECT_EQ(sum[1].in_flight, 1u);
}

TEST(SharedStateWire, PublishedLoadSaysWhichRoutedRecordsItCovers) {
  const std::string text = wire::pack_load_seq(42) + wire::pack_load({{"http://a:1", 2, 100, 0.5, 0.3, 40}});
  EXPECT_EQ(wire::load_seq(text), 42u);
  EXPECT_EQ(wire::load_seq(wire::pack_load({{"http://a:1", 2, 100, 0.5, 0.3, 40}})), 0u);  // none: covers nothing
  std::vector<WorkerLoad> sum;
  wire::add_load(text, sum);  // the count line is not a worker's
  ASSERT_EQ(sum.size(), 1u);
  EXPECT_EQ(sum[0].in_flight, 2u);
  // A routed record's share: one request, its pending prefill.
  const auto share = wire::unpack_share(wire::pack_share(policy::LoadShare{1, 4096, 0, 0.25, 0}));
  ASSERT_TRUE(share);
  EXPECT_EQ(share->in_flight, 1u);
  EXPECT_EQ(share->pending_prefill_tokens, 4096u);
  EXPECT_DOUBLE_EQ(share->pending_prefill_s, 0.25);
  EXPECT_FALSE(wire::unpack_share("12"));
  EXPECT_FALSE(wire::unpack_share("x\t1"));
  EXPECT_FALSE(wire::unpack_share("1\tnan"));
  EXPECT_EQ(wire::parse_count("17"), 17u);
  EXPECT_FALSE(wire::parse_count("-1"));
  EXPECT_FALSE(wire::parse_count(""));
}

TEST(SharedStateWire, RatesAndAttributesRoundTrip) {
  policy::WorkerRates r;
  r.prefill_tokens_per_s = 12345.5;
  r.decode_correction = 1.25;
  r.prefill_samples = 17;
  auto back = wire::unpack_rates(wire::pack_rates(r));
  ASSERT_TRUE(back);
  EXPECT_DOUBLE_EQ(back->prefill_tokens_per_s, 12345.5);
  EXPECT_DOUBLE_EQ(back->decode_correction, 1.25);
  EXPECT_EQ(back->prefill_samples, 17u);
  EXPECT_FALSE(wire::unpack_rates("1\t2"));
  const auto attrs = decode_attrs(encode_attrs({{"model", "m"}, {"kv_events", ""}, {"bad", "a\tb"}, {"dp_size", "2"}}));
  ASSERT_EQ(attrs.size(), 2u);
  EXPECT_EQ(attrs[0], (std::pair<std::string, std::string>{"model", "m"}));
  EXPECT_EQ(attrs[1], (std::pair<std::string, std::string>{"dp_size", "2"}));
}

TEST(SharedStateWire, StreamIdsCompareAsNumbers) {
  EXPECT_LT(wire::compare_ids("9-1", "10-0"), 0);
  EXPECT_GT(wire::compare_ids("10-2", "10-1"), 0);
  EXPECT_EQ(wire::compare_ids("5-5", "5-5"), 0);
}

// A replica whose Redis is unreachable queues what it routed, and drops the oldest once the queue holds
// queue_limit_blocks block hashes: long prompts must not make the queue grow by gigabytes.
class Ignore : public Handler {
 public:
  void apply_routed(const Routed&) override {}
  void apply_session(std::uint64_t, const std::string&) override {}
  void apply_response_owner(const std::string&, const std::string&) override {}
  void apply_prefix_computed(const std::string&, hashing::BlockHash) override {}
  void apply_admin(const AdminChange&) override {}
  void apply_admin_state(const AdminState&) override {}
  void apply_rates(const std::string&, const policy::WorkerRates&) override {}
  void apply_remote_load(std::vector<WorkerLoad>) override {}
  std::vector<WorkerLoad> local_load() override { return {}; }
  std::vector<std::pair<std::string, std::uint64_t>> local_ended() override { return {}; }
  void apply_others_ended(const std::vector<std::pair<std::string, std::uint64_t>>&) override {}
  std::vector<std::pair<std::string, policy::WorkerRates>> local_rates() override { return {}; }
  void up_changed(bool, const std::string&) override {}
};

TEST(SharedStateQueue, WhileRedisIsAwayTheQueuedBlocksStayBounded) {
  SharedState::Options o;
  auto url = parse_redis_url("redis://127.0.0.1:1");  // nothing listens there
  ASSERT_TRUE(url);
  o.url = *url;
  o.queue_limit_blocks = 10'000;
  Ignore handler;
  SharedState shared(o, handler);  // not started: nothing is sent, as while Redis is down
  const std::vector<hashing::BlockHash> chain(4'096, 7);  // a 64K-token prompt at 16 tokens per block
  for (int i = 0; i < 20; ++i) shared.routed("http://w0:8000", 1, chain, 0, policy::LoadShare{1, 65'536, 0, 1.0, 0}, 0);
  const auto st = shared.status();
  EXPECT_EQ(st.queued, 2u);  // 8,192 blocks; a third would pass 10,000
  EXPECT_EQ(st.dropped, 18u);
  // A short record still fits beside them.
  shared.routed("http://w0:8000", 1, std::vector<hashing::BlockHash>(16, 9), 0, policy::LoadShare{1, 256, 0, 0.01, 0}, 0);
  EXPECT_EQ(shared.status().queued, 3u);
}

}  // namespace
}  // namespace kvroute::shared_state
