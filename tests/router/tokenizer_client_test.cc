#include "router/tokenizer_client.h"

#include <gtest/gtest.h>

#include "router/request.h"

namespace kvroute::router {
namespace {

TEST(TokenizeCache, BoundedLeastRecentlyUsed) {
  TokenizeCache cache(2);
  auto t = [](std::uint32_t x) { return std::make_shared<const std::vector<std::uint32_t>>(1, x); };
  cache.put(1, t(10));
  cache.put(2, t(20));
  ASSERT_TRUE(cache.get(1));  // 1 is now the most recent
  cache.put(3, t(30));        // evicts 2
  EXPECT_FALSE(cache.get(2));
  EXPECT_EQ((*cache.get(1))[0], 10u);
  EXPECT_EQ((*cache.get(3))[0], 30u);
  EXPECT_EQ(cache.size(), 2u);
  TokenizeCache off(0);
  off.put(1, t(1));
  EXPECT_FALSE(off.get(1));
}

TEST(TokenizeResponse, ParsesVllmShapeAndRejectsBadAnswers) {
  auto ok = parse_tokenize_response(R"({"count":3,"max_model_len":32768,"tokens":[1,2,4294967295],"token_strs":null})");
  ASSERT_TRUE(ok);
  EXPECT_EQ(*ok, (std::vector<std::uint32_t>{1, 2, 4294967295u}));
  EXPECT_FALSE(parse_tokenize_response("not json"));
  EXPECT_FALSE(parse_tokenize_response(R"({"count":1})"));
  EXPECT_FALSE(parse_tokenize_response(R"({"tokens":[1,-2]})"));
  EXPECT_FALSE(parse_tokenize_response(R"({"tokens":[1,2,3]})", 2));
}

TEST(TokenizeRequest, BodiesFollowVllmAndTokensReplaceTheTextChain) {
  auto chat = parse_request(Endpoint::kChatCompletions, R"({"model":"m","messages":[{"role":"user","content":"hi"}]})",
                            {}, ParseOptions{16, 64, true});
  ASSERT_TRUE(chat);
  EXPECT_NE(chat->tokenize_body.find("\"messages\""), std::string::npos);
  EXPECT_NE(chat->tokenize_body.find("\"add_generation_prompt\":true"), std::string::npos);
  EXPECT_NE(chat->tokenize_key, 0u);
  auto text = parse_request(Endpoint::kCompletions, R"({"model":"m","prompt":"hello"})", {}, ParseOptions{16, 64, true});
  ASSERT_TRUE(text);
  EXPECT_EQ(text->tokenize_body, R"({"model":"m","prompt":"hello"})");
  auto ids = parse_request(Endpoint::kCompletions, R"({"model":"m","prompt":[1,2,3]})", {}, ParseOptions{16, 64, true});
  ASSERT_TRUE(ids);
  EXPECT_TRUE(ids->tokenize_body.empty());  // already token ids
  auto off = parse_request(Endpoint::kCompletions, R"({"model":"m","prompt":"hello"})", {}, {});
  EXPECT_TRUE(off->tokenize_body.empty());

  std::vector<std::uint32_t> tokens(40, 7);
  use_token_ids(*text, tokens, 16);
  EXPECT_EQ(text->chain.unit, hashing::Unit::kToken);
  EXPECT_EQ(text->chain.hashes.size(), 2u);
  EXPECT_EQ(text->prompt_tokens, 40u);
  EXPECT_EQ(text->chain.root, hashing::namespace_root("m", ""));
}

}  // namespace
}  // namespace kvroute::router
