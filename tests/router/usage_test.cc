#include "router/usage.h"

#include <cstdint>
#include <string>

#include <gtest/gtest.h>

namespace kvroute::router {
namespace {

// find_usage(text) finds a usage with these three counts.
void expect_usage(const std::string& text, std::uint64_t prompt, std::uint64_t completion, std::uint64_t cached) {
  auto u = find_usage(text);
  ASSERT_TRUE(u) << text;
  EXPECT_EQ(u->prompt_tokens, prompt);
  EXPECT_EQ(u->completion_tokens, completion);
  EXPECT_EQ(u->cached_tokens, cached);
}

TEST(Usage, NonStreamingBody) {
  const std::string body =
      R"({"id":"c1","choices":[{"index":0,"message":{"role":"assistant","content":"the \"usage\": 7 of it"}}],)"
      R"("usage":{"prompt_tokens":1200,"completion_tokens":35,"total_tokens":1235,)"
      R"("prompt_tokens_details":{"cached_tokens":1024,"audio_tokens":[1,2]},"completion_tokens_details":null}})";
  expect_usage(body, 1200, 35, 1024);
}

// A stream's chunks carry "usage": null until the last one; whitespace as servers format it.
TEST(Usage, LastEventOfAStream) {
  const std::string tail =
      "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}],\"usage\": null}\n\n"
      "data: {\"choices\":[],\"usage\": {\n  \"prompt_tokens\": 16,\n  \"completion_tokens\": 2,\n"
      "  \"prompt_tokens_details\": {\"cached_tokens\": 0}\n}}\n\n"
      "data: [DONE]\n\n";
  expect_usage(tail, 16, 2, 0);
}

// Numbers elsewhere (an array under a counted key, a nested object's own keys, a negative count) are not
// taken for counts; a details object without cached_tokens leaves it 0.
TEST(Usage, OnlyTheThreeCountsAreRead) {
  expect_usage(R"({"usage":{"prompt_tokens":[5],"completion_tokens":-3,"extra":{"prompt_tokens":9},)"
               R"("prompt_tokens_details":{"image_tokens":4}}})",
               0, 0, 0);
}

// A usage object cut short (the tail began inside it, or the response broke off) does not parse: an earlier
// complete one is taken if there is one.
TEST(Usage, TruncatedOrMissing) {
  EXPECT_FALSE(find_usage(R"({"choices":[]})"));
  EXPECT_FALSE(find_usage(R"({"usage":{"prompt_tokens":12,"completion_)"));
  EXPECT_FALSE(find_usage(R"({"usage":null})"));
  expect_usage(R"(data: {"usage":{"prompt_tokens":3,"completion_tokens":1}}

data: {"usage":{"prompt_tokens":4,"comple)",
               3, 1, 0);
}

// The extra chunk include_usage adds is recognised, with whitespace as servers format it; every chunk that
// carries anything else is passed on.
TEST(Usage, UsageOnlyChunk) {
  auto u = usage_only_chunk(R"( {"id":"c1","object":"chat.completion.chunk","choices":[],)"
                            R"("usage":{"prompt_tokens":16,"completion_tokens":2,"total_tokens":18,)"
                            R"("prompt_tokens_details":{"cached_tokens":8}}})"
                            "\n\n");
  ASSERT_TRUE(u);
  EXPECT_EQ(u->prompt_tokens, 16u);
  EXPECT_EQ(u->completion_tokens, 2u);
  EXPECT_EQ(u->cached_tokens, 8u);
  u = usage_only_chunk("{\"choices\" : [ ],\n \"usage\" : {\"prompt_tokens\": 3, \"completion_tokens\": 1}}");
  ASSERT_TRUE(u);
  EXPECT_EQ(u->prompt_tokens, 3u);

  // Tokens, with usage null, absent or present (continuous usage stats), or quoted in the text.
  EXPECT_FALSE(usage_only_chunk(R"({"choices":[{"index":0,"delta":{"content":"hi"}}],"usage":null})"));
  EXPECT_FALSE(usage_only_chunk(R"({"choices":[{"index":0,"delta":{"content":"hi"}}]})"));
  EXPECT_FALSE(usage_only_chunk(R"({"choices":[{"delta":{}}],"usage":{"prompt_tokens":3,"completion_tokens":1}})"));
  EXPECT_FALSE(usage_only_chunk(R"({"choices":[0],"usage":{"prompt_tokens":3}})"));
  EXPECT_FALSE(usage_only_chunk(R"({"choices":[{"delta":{"content":"\"choices\":[],\"usage\":{}"}}]})"));
  // No choices, choices not an array, usage not at the top, not JSON, cut short.
  EXPECT_FALSE(usage_only_chunk(R"({"usage":{"prompt_tokens":3,"completion_tokens":1}})"));
  EXPECT_FALSE(usage_only_chunk(R"({"choices":{},"usage":{"prompt_tokens":3}})"));
  EXPECT_FALSE(usage_only_chunk(R"({"choices":[],"x":{"usage":{"prompt_tokens":3}}})"));
  EXPECT_FALSE(usage_only_chunk("[DONE]"));
  EXPECT_FALSE(usage_only_chunk(R"({"choices":[],"usage":{"prompt_tokens":3)"));
  // A number elsewhere in the chunk is not a count.
  u = usage_only_chunk(R"({"prompt_tokens":99,"choices":[],"usage":{"completion_tokens":4},"completion_tokens":7})");
  ASSERT_TRUE(u);
  EXPECT_EQ(u->prompt_tokens, 0u);
  EXPECT_EQ(u->completion_tokens, 4u);
}

TEST(Usage, ResponsesApiNames) {
  // A non-streaming Responses API body, and the response.completed event that ends its stream.
  expect_usage(R"({"id":"resp_1","output":[],"usage":{"input_tokens":120,"input_tokens_details":{"cached_tokens":96},)"
               R"("output_tokens":7,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":127}})",
               120, 7, 96);
  expect_usage("event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":9,\"response\":"
               "{\"id\":\"resp_1\",\"usage\":{\"input_tokens\":50,\"input_tokens_details\":{\"cached_tokens\":32},"
               "\"output_tokens\":4,\"total_tokens\":54}}}\n\n",
               50, 4, 32);
}

// The response's own status, wherever it sits and however the body is cut: not an output item's status.
std::optional<std::string> status_of(std::string_view body, std::size_t piece) {
  ResponseStatusReader r;
  for (std::size_t i = 0; i < body.size(); i += piece) r.feed(body.substr(i, piece));
  return r.finish();
}

TEST(ResponseStatus, TopLevelStatusInAnyOrderAndAnyPieces) {
  // vLLM: the status after the output, whose items carry statuses of their own.
  const std::string vllm = R"({"id":"resp_1","output":[{"type":"message","status":"completed","content":[{"type":)"
                           R"("output_text","text":")" + std::string(5000, 'x') +
                           R"("}]}],"parallel_tool_calls":true,"status":"in_progress","text":{"format":{"type":"text"}},)"
                           R"("usage":null})";
  // kvroute-sim: the status first.
  const std::string sim = R"({"id":"resp_2","object":"response","status":"cancelled","output":[{"status":"completed"}]})";
  for (std::size_t piece : {1, 7, 64, 100000}) {
    EXPECT_EQ(status_of(vllm, piece), "in_progress") << piece;
    EXPECT_EQ(status_of(sim, piece), "cancelled") << piece;
  }
  EXPECT_FALSE(status_of(R"({"id":"resp_3","output":[{"status":"completed"}]})", 8));  // none of its own
  EXPECT_FALSE(status_of(R"({"status":"completed")", 8));                               // cut short
  EXPECT_FALSE(status_of("event: response.completed\ndata: {}\n\n", 8));             // a stream, not an object
  EXPECT_FALSE(status_of(R"({"error":{"message":"no such response","status":404}})", 8));
  EXPECT_TRUE(final_response_status("completed"));
  EXPECT_TRUE(final_response_status("failed"));
  EXPECT_TRUE(final_response_status("cancelled"));
  EXPECT_TRUE(final_response_status("incomplete"));
  EXPECT_FALSE(final_response_status("in_progress"));
  EXPECT_FALSE(final_response_status("queued"));
}

}  // namespace
}  // namespace kvroute::router
