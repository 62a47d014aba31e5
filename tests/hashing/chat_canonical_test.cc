#include "hashing/chat_canonical.h"

#include <boost/json.hpp>
#include <gtest/gtest.h>

#include "hashing/block_chain.h"

namespace kvroute::hashing {
namespace {

boost::json::value msgs(const char* json) { return boost::json::parse(json); }

TEST(ChatCanonical, ExactFormat) {
  auto text = canonical_chat(msgs(R"([{"role":"system","content":"S"},{"role":"user","content":"hi"}])"), nullptr);
  ASSERT_TRUE(text);
  EXPECT_EQ(*text, std::string("\x02system\x1fS\x03\x02user\x1fhi\x03"));
}

TEST(ChatCanonical, TurnNIsBytePrefixOfTurnNPlusOne) {
  std::string history = R"([{"role":"system","content":"You are terse."})";
  std::string prev;
  for (int turn = 0; turn < 5; ++turn) {
    history += R"(,{"role":"user","content":"question )" + std::to_string(turn) + R"("})";
    auto text = canonical_chat(msgs((history + "]").c_str()), nullptr);
    ASSERT_TRUE(text);
    EXPECT_EQ(text->compare(0, prev.size(), prev), 0) << "turn " << turn;
    prev = *text;
    history += R"(,{"role":"assistant","content":"answer )" + std::to_string(turn) + R"("})";
  }
  // The chains agree on every block of the shorter text.
  auto t1 = canonical_chat(msgs((history + "]").c_str()), nullptr);
  const auto a = hash_text(1, prev), b = hash_text(1, *t1);
  ASSERT_LE(a.hashes.size(), b.hashes.size());
  for (std::size_t i = 0; i < a.hashes.size(); ++i) EXPECT_EQ(a.hashes[i], b.hashes[i]);
}

TEST(ChatCanonical, ContentPartsToolCallsAndToolsAreDeterministic) {
  auto a = canonical_chat(
      msgs(R"([{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
               {"role":"assistant","content":null,"tool_calls":[{"id":"1","function":{"name":"f","arguments":"{}"},"type":"function"}]},
               {"role":"tool","tool_call_id":"1","content":"r"}])"),
      nullptr);
  auto b = canonical_chat(
      msgs(R"([{"content":[{"text":"a","type":"text"},{"type":"text","text":"b"}],"role":"user"},
               {"tool_calls":[{"type":"function","function":{"arguments":"{}","name":"f"},"id":"1"}],"role":"assistant"},
               {"content":"r","role":"tool","tool_call_id":"1"}])"),
      nullptr);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(*a, *b);  // key order does not matter
  EXPECT_NE(a->find("ab"), std::string::npos);
  const auto tools = boost::json::parse(R"([{"type":"function","function":{"name":"f"}}])");
  auto c = canonical_chat(msgs(R"([{"role":"user","content":"x"}])"), &tools);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->rfind("\x02tools\x1f", 0), 0u);  // tools come first
}

TEST(ChatCanonical, ErrorsNameTheField) {
  auto r = canonical_chat(msgs(R"({"role":"user"})"), nullptr);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("messages"), std::string::npos);
  r = canonical_chat(msgs(R"([{"content":"x"}])"), nullptr);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("messages[0].role"), std::string::npos);
  r = canonical_chat(msgs(R"([{"role":"user","content":5}])"), nullptr);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("content"), std::string::npos);
}

}  // namespace
}  // namespace kvroute::hashing
