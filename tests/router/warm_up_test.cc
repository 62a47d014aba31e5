// The body a warm-up sends (router/warm_up.h): the request's own prompt, for one token, not streamed.
#include <boost/json.hpp>
#include <gtest/gtest.h>

#include "router/warm_up.h"

namespace kvroute::router {
namespace {

namespace json = boost::json;

TEST(WarmUp, TheBodyAsksForOneTokenNotStreamedAndKeepsThePromptAndItsNamespace) {
  const auto body = warm_up_body(
      R"({"model":"m","messages":[{"role":"system","content":"doc"},{"role":"user","content":"q"}],"stream":true,)"
      R"("stream_options":{"include_usage":true},"max_completion_tokens":900,"n":3,"logprobs":true,"top_logprobs":5,)"
      R"("min_tokens":40,"tools":[{"type":"function","function":{"name":"f"}}],"cache_salt":"t1"})");
  ASSERT_TRUE(body) << body.error().message;
  const json::object o = json::parse(*body).as_object();
  EXPECT_EQ(o.at("max_tokens"), 1);
  EXPECT_EQ(o.at("stream"), false);
  for (const char* gone : {"stream_options", "max_completion_tokens", "n", "logprobs", "top_logprobs", "min_tokens"})
    EXPECT_FALSE(o.contains(gone)) << gone;
  // What the prompt is made of (and the worker's cache namespace) is the request's own.
  EXPECT_EQ(o.at("messages"), json::parse(R"([{"role":"system","content":"doc"},{"role":"user","content":"q"}])"));
  EXPECT_EQ(o.at("tools").as_array().size(), 1u);
  EXPECT_EQ(o.at("cache_salt"), "t1");
  EXPECT_EQ(o.at("model"), "m");
}

TEST(WarmUp, ACompletionsBodyGetsOneTokenWhateverItsLimit) {
  const auto body = warm_up_body(R"({"model":"m","prompt":[1,2,3],"max_tokens":4096,"best_of":2,"prompt_logprobs":1})");
  ASSERT_TRUE(body);
  const json::object o = json::parse(*body).as_object();
  EXPECT_EQ(o.at("max_tokens"), 1);
  EXPECT_FALSE(o.contains("best_of"));
  EXPECT_FALSE(o.contains("prompt_logprobs"));
  EXPECT_EQ(o.at("prompt"), json::parse("[1,2,3]"));
}

TEST(WarmUp, ABodyThatIsNotAJsonObjectIsRefused) {
  EXPECT_FALSE(warm_up_body("[1,2]"));
  EXPECT_FALSE(warm_up_body("{\"model\":"));
  EXPECT_FALSE(warm_up_body(""));
}

}  // namespace
}  // namespace kvroute::router
