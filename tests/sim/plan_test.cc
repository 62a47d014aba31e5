// The capacity planner (backends/sim/plan.h) against the seed's published budgeting figures (issue 23).
#include "backends/sim/plan.h"

#include <gtest/gtest.h>

namespace kvroute::sim {
namespace {

constexpr double kGiB = 1073741824.0;

PlanInput input(const char* model, const char* gpu, std::uint64_t context, std::uint32_t concurrency) {
  PlanInput in;
  in.model = builtin_model(model).value();
  in.gpu = builtin_gpu(gpu).value();
  in.context_tokens = context;
  in.concurrency = concurrency;
  return in;
}

TEST(Plan, SixteenLlama70bSequencesAt8kNeed40GiB) {
  const PlanInput in = input("llama-3.1-70b", "h100-80gb", 8192, 16);
  auto p = make_plan(in);
  ASSERT_TRUE(p.ok()) << p.error().message;
  EXPECT_DOUBLE_EQ(p->base.kv_bytes_per_sequence, 2.5 * kGiB);
  EXPECT_DOUBLE_EQ(p->base.kv_bytes_total, 40 * kGiB);
  // 141 GB of BF16 weights do not fit one 80 GB H100: the verdict says so and the plan grows the worker.
  EXPECT_FALSE(p->base.fits);
  EXPECT_GT(p->base.gpus_per_worker, 1u);
  const std::string r = plan_report(in, *p);
  EXPECT_NE(r.find("40.0 GiB"), std::string::npos) << r;
  EXPECT_NE(r.find("the weights alone do not fit"), std::string::npos) << r;
}

TEST(Plan, Llama70bFp8WeightsAndCacheOnOneH200Holds44SequencesAt8k) {
  PlanInput in = input("llama-3.1-70b", "h200-141gb", 8192, 44);
  in.kv_bytes_per_value = 1;
  in.weight_bytes_per_param = 1;
  auto p = make_plan(in);
  ASSERT_TRUE(p.ok()) << p.error().message;
  EXPECT_EQ(p->base.sequences_on_given, 44u);
  EXPECT_EQ(p->base.sequences_per_worker, 44u);
  EXPECT_TRUE(p->base.fits);
  EXPECT_EQ(p->base.gpus, 1u);
  in.concurrency = 45;  // one more does not fit: two GPUs
  auto over = make_plan(in);
  ASSERT_TRUE(over.ok());
  EXPECT_FALSE(over->base.fits);
  EXPECT_EQ(over->recommended.gpus, 2u);
  // Already FP8: no FP8 step on the ladder, and the report says so.
  for (const auto& s : over->ladder) EXPECT_EQ(s.name.find("FP8"), std::string::npos) << s.name;
  EXPECT_NE(plan_report(in, *over).find("already FP8"), std::string::npos);
}

TEST(Plan, ThirtyTwoUsersSharingA16kPrefixNeed4Point4TimesFewerTokens) {
  PlanInput in = input("llama-3.1-8b", "h100-80gb", 16384 + 4096, 32);
  in.shared_prefix_tokens = 16384;
  in.sharing_users = 32;
  auto p = make_plan(in);
  ASSERT_TRUE(p.ok()) << p.error().message;
  EXPECT_DOUBLE_EQ(p->base.tokens_total, 655360);
  ASSERT_FALSE(p->ladder.empty());
  EXPECT_EQ(p->ladder[0].name, "1. shared prefix");
  EXPECT_DOUBLE_EQ(p->ladder[0].tokens_total, 147456);
  EXPECT_NEAR(p->base.tokens_total / p->ladder[0].tokens_total, 4.4, 0.05);
  // 655,360 tokens x 128 KiB = 80 GiB does not fit; 147,456 x 128 KiB = 18 GiB does.
  EXPECT_FALSE(p->base.fits);
  EXPECT_TRUE(p->ladder[0].fits);
  EXPECT_EQ(p->recommended.name, "1. shared prefix");
  const std::string r = plan_report(in, *p);
  EXPECT_NE(r.find("4.4x fewer cached tokens"), std::string::npos) << r;
  EXPECT_NE(r.find("147,456 cached tokens"), std::string::npos) << r;
}

TEST(Plan, Llama8bOnH100With8GiBAllowanceLeaves56Point7GiBAnd14SequencesOf32k) {
  PlanInput in = input("llama-3.1-8b", "h100-80gb", 32768, 14);
  in.allowance_bytes = 8 * kGiB;
  auto p = make_plan(in);
  ASSERT_TRUE(p.ok()) << p.error().message;
  EXPECT_NEAR(p->base.kv_room_bytes / kGiB, 56.7, 0.05);
  EXPECT_DOUBLE_EQ(p->base.kv_bytes_per_sequence, 4 * kGiB);
  EXPECT_EQ(p->base.sequences_on_given, 14u);
  EXPECT_TRUE(p->base.fits);
  const std::string r = plan_report(in, *p);
  EXPECT_NE(r.find("56.7 GiB"), std::string::npos) << r;
  // The flags for kvroute: the pool in 16-token blocks of 128 KiB, and the sequences that fit.
  EXPECT_EQ(p->recommended.kv_blocks_per_worker,
            static_cast<std::uint64_t>(p->base.kv_room_bytes / (16 * 131072.0)));
  EXPECT_NE(r.find("--worker-kv-blocks " + std::to_string(p->recommended.kv_blocks_per_worker) +
                   " --worker-max-seqs 14"), std::string::npos) << r;
}

TEST(Plan, LadderOrderAndFigures) {
  // 64 sequences of 32K of Llama 3.1 8B on one H100: 256 GiB of 16-bit KV. The ladder: shared prefix, FP8
  // cache, MLA-sized cache, then GPUs; each step holds more sequences per worker than the one before.
  PlanInput in = input("llama-3.1-8b", "h100-80gb", 32768, 64);
  in.shared_prefix_tokens = 8192;
  in.sharing_users = 8;
  auto p = make_plan(in);
  ASSERT_TRUE(p.ok()) << p.error().message;
  ASSERT_EQ(p->ladder.size(), 3u);
  EXPECT_EQ(p->ladder[0].name, "1. shared prefix");
  EXPECT_EQ(p->ladder[1].name, "2. FP8 KV cache");
  EXPECT_EQ(p->ladder[2].name, "3. MLA-sized KV cache");
  EXPECT_LT(p->base.sequences_on_given, p->ladder[0].sequences_on_given);
  EXPECT_LT(p->ladder[0].sequences_on_given, p->ladder[1].sequences_on_given);
  EXPECT_LT(p->ladder[1].sequences_on_given, p->ladder[2].sequences_on_given);
  EXPECT_DOUBLE_EQ(p->ladder[1].kv_bytes_per_token, 64 * 1024);
  // MLA at Llama 8B's 32 layers, FP8: (512 + 64) x 32 x 1 bytes.
  EXPECT_DOUBLE_EQ(p->mla_kv_bytes_per_token, 576.0 * 32);
  EXPECT_LT(p->max_kv_heads, 8u);
  // Nothing fits one worker: the recommendation is the FP8 configuration spread over enough GPUs.
  EXPECT_EQ(p->recommended.name, "2. FP8 KV cache");
  EXPECT_GE(p->recommended.workers * p->recommended.sequences_per_worker, 64u);
  EXPECT_EQ(p->recommended.gpus, p->recommended.workers);
  const std::string r = plan_report(in, *p);
  EXPECT_NE(r.find("does not fit"), std::string::npos) << r;
  EXPECT_NE(r.find("4. more GPUs"), std::string::npos) << r;
  EXPECT_NE(r.find("--kv-cache-dtype fp8"), std::string::npos) << r;
}

TEST(Plan, MlaAndSlidingWindowModels) {
  auto ds = make_plan(input("deepseek-v3", "h200-141gb", 8192, 8));
  ASSERT_TRUE(ds.ok());
  EXPECT_EQ(ds->base.gpus_per_worker, 8u);  // 671 GB of FP8 weights: one 8-GPU worker
  EXPECT_NEAR(ds->base.kv_bytes_per_token / 1024, 68.6, 0.05);
  // 2,000 sequences on 8-GPU workers: neither remedy 1 nor 2 is enough, and remedy 3 is already taken.
  PlanInput in = input("deepseek-v3", "h200-141gb", 8192, 2000);
  in.gpus_per_worker = 8;
  auto many = make_plan(in);
  ASSERT_TRUE(many.ok());
  EXPECT_NE(plan_report(in, *many).find("already uses MLA"), std::string::npos) << plan_report(in, *many);

  PlanInput mistral = input("llama-3.1-8b", "h100-80gb", 32768, 4);
  mistral.model = parse_model_config(R"({"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
      "num_key_value_heads": 8, "sliding_window": 4096})", "mistral").value();
  auto p = make_plan(mistral);
  ASSERT_TRUE(p.ok());
  EXPECT_DOUBLE_EQ(p->base.kv_bytes_per_sequence, mistral.model.kv_bytes_for_sequence(32768));
}

TEST(Plan, BadInputIsAClearError) {
  PlanInput in = input("llama-3.1-8b", "h100-80gb", 4096, 4);
  in.shared_prefix_tokens = 4096;
  auto p = make_plan(in);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.error().message.find("shorter than the context"), std::string::npos);
  in.shared_prefix_tokens = 0;
  in.kv_bytes_per_value = 0.5;
  EXPECT_FALSE(make_plan(in).ok());
  in.kv_bytes_per_value = 0;
  in.concurrency = 0;
  EXPECT_FALSE(make_plan(in).ok());
}

TEST(Plan, CpuTierHoldsEvictedPrefixTokens) {
  PlanInput in = input("llama-3.1-8b", "h100-80gb", 8192, 16);
  in.cpu_tier_bytes = 64 * kGiB;
  auto p = make_plan(in);
  ASSERT_TRUE(p.ok());
  EXPECT_DOUBLE_EQ(p->cpu_tier_tokens, 64 * kGiB / 131072);  // 524,288 tokens of 128 KiB
  EXPECT_NE(plan_report(in, *p).find("524,288 more tokens"), std::string::npos);
}

}  // namespace
}  // namespace kvroute::sim
