#include "router/request.h"

#include <boost/json.hpp>
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace kvroute::router {
namespace {

Result<RoutableRequest> chat(const std::string& body, RequestHeaders h = {}) {
  return parse_request(Endpoint::kChatCompletions, body, h, {});
}
Result<RoutableRequest> completion(const std::string& body) {
  return parse_request(Endpoint::kCompletions, body, {}, {});
}

TEST(Request, ChatFieldsAndChain) {
  const std::string sys(400, 's');
  auto r = chat(R"({"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":7,"user":"u1",
                   "messages":[{"role":"system","content":")" + sys + R"("},{"role":"user","content":"hello"}]})");
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->model, "m");
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
  EXPECT_EQ(r->max_tokens, 7u);
  EXPECT_EQ(r->session_key, "u1");
  EXPECT_EQ(r->chain.hashes.size(), (400u + 20) / 64);
  EXPECT_GT(r->prompt_tokens, 100u);
  EXPECT_EQ(r->affinity_key, std::string("m") + '\0' + "hello");
}

TEST(Request, SessionHeaderWinsOverUser) {
  auto r = chat(R"({"model":"m","user":"u1","messages":[{"role":"user","content":"x"}]})", {"s-9", "", ""});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->session_key, "s-9");
}

TEST(Request, SheddableByPriorityHeaderOrFlexServiceTier) {
  const std::string body = R"({"model":"m","messages":[{"role":"user","content":"x"}]})";
  EXPECT_FALSE(chat(body)->sheddable);
  EXPECT_TRUE(chat(body, {"", "", "sheddable"})->sheddable);
  EXPECT_TRUE(chat(body, {"", "", "SHEDDABLE"})->sheddable);
  EXPECT_FALSE(chat(body, {"", "", "critical"})->sheddable);
  auto flex = chat(R"({"model":"m","service_tier":"flex","messages":[{"role":"user","content":"x"}]})");
  ASSERT_TRUE(flex);
  EXPECT_TRUE(flex->sheddable);
  EXPECT_FALSE(chat(R"({"model":"m","service_tier":"default","messages":[{"role":"user","content":"x"}]})")->sheddable);
  EXPECT_FALSE(chat(R"({"model":"m","service_tier":null,"messages":[{"role":"user","content":"x"}]})")->sheddable);
  auto bad = chat(R"({"model":"m","service_tier":3,"messages":[{"role":"user","content":"x"}]})");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("service_tier"), std::string::npos);
}

TEST(Request, CacheSaltAndTenantSeparateNamespaces) {
  const std::string text(256, 'p');
  SaltOptions allow;
  allow.allow_client_cache_salt = true;
  auto salted = [&](const std::string& body) { return parse_request(Endpoint::kCompletions, body, {}, {}, allow); };
  auto a = salted(R"({"model":"m","prompt":")" + text + R"(","cache_salt":"a"})");
  auto b = salted(R"({"model":"m","prompt":")" + text + R"(","cache_salt":"b"})");
  auto c = completion(R"({"model":"m","prompt":")" + text + R"("})");
  ASSERT_TRUE(a && b && c);
  EXPECT_NE(a->chain.hashes[0], b->chain.hashes[0]);
  EXPECT_NE(a->chain.hashes[0], c->chain.hashes[0]);
  // Without --allow-client-cache-salt a client's salt is dropped: the shared namespace.
  auto dropped = completion(R"({"model":"m","prompt":")" + text + R"(","cache_salt":"a"})");
  ASSERT_TRUE(dropped);
  EXPECT_EQ(dropped->chain.hashes[0], c->chain.hashes[0]);
  auto t1 = parse_request(Endpoint::kCompletions, R"({"model":"m","prompt":")" + text + R"("})", {"", "tenant-1", ""}, {});
  ASSERT_TRUE(t1);
  EXPECT_NE(t1->chain.hashes[0], c->chain.hashes[0]);
}

TEST(Request, TokenIdPrompts) {
  std::string ids;
  for (int i = 0; i < 40; ++i) ids += (i ? "," : "") + std::to_string(i);
  auto r = completion(R"({"model":"m","prompt":[)" + ids + "]}");
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->chain.unit, hashing::Unit::kToken);
  EXPECT_EQ(r->chain.hashes.size(), 2u);
  EXPECT_EQ(r->prompt_tokens, 40u);
  auto batch = completion(R"({"model":"m","prompt":[[)" + ids + "],[1,2]]}");
  ASSERT_TRUE(batch);
  EXPECT_EQ(batch->chain.hashes, r->chain.hashes);
}

// The document is built in a per-thread arena and spills to the heap past it: a body far larger than the
// arena, parsed between small ones, must give the same chain as the same text as a completion prompt.
TEST(Request, BodiesLargerThanTheParseArena) {
  std::string messages;
  std::string text;
  for (int i = 0; i < 400; ++i) {
    const std::string piece = "turn " + std::to_string(i) + " " + std::string(500, static_cast<char>('a' + i % 26));
    messages += std::string(i ? "," : "") + R"({"role":"user","content":")" + piece + R"("})";
  }
  const std::string body = R"({"model":"m","stream":true,"messages":[)" + messages + "]}";
  ASSERT_GT(body.size(), 200'000u);
  auto small = chat(R"({"model":"m","messages":[{"role":"user","content":"x"}]})");
  auto big = chat(body);
  auto again = chat(body);
  ASSERT_TRUE(small && big && again) << (big ? "" : big.error().message);
  EXPECT_EQ(big->chain.hashes, again->chain.hashes);
  EXPECT_GT(big->chain.hashes.size(), 3000u);
  // The streamed request is rewritten to ask for usage.
  ASSERT_TRUE(big->strip_usage);
  const boost::json::value up = boost::json::parse(big->upstream_body);
  EXPECT_EQ(up.at("messages").as_array().size(), 400u);
  EXPECT_EQ(up.at("stream_options").at("include_usage"), true);
  auto after = chat(R"({"model":"m","messages":[{"role":"user","content":"x"}]})");
  ASSERT_TRUE(after);
  EXPECT_EQ(after->chain.hashes, small->chain.hashes);
}

// A streamed request that does not ask for usage is forwarded asking for it, whatever shape its
// stream_options had; everything else in the body reaches the worker unchanged.
TEST(Request, StreamWithoutUsageIsForwardedAskingForIt) {
  const std::string rest = R"("model":"m","stream":true,"max_tokens":3,"messages":[{"role":"user","content":"q \" {"}])";
  for (const std::string& body : {"{" + rest + "}", " \n\t{ " + rest + " }\n", "{" + rest + R"(,"stream_options":null})",
                                   "{" + rest + R"(,"stream_options":{}})", "{" + rest + R"(,"stream_options":{"include_usage":false}})"}) {
    SCOPED_TRACE(body);
    auto r = chat(body);
    ASSERT_TRUE(r) << r.error().message;
    EXPECT_FALSE(r->include_usage);
    ASSERT_TRUE(r->strip_usage);
    boost::system::error_code ec;
    const boost::json::value up = boost::json::parse(r->upstream_body, ec);
    ASSERT_FALSE(ec) << r->upstream_body;
    EXPECT_EQ(up.at("stream_options").at("include_usage"), true);
    EXPECT_EQ(up.at("model"), "m");
    EXPECT_EQ(up.at("max_tokens"), 3);
    EXPECT_EQ(up.at("messages").at(0).at("content"), "q \" {");
    EXPECT_EQ(up.as_object().size(), 5u);
  }
  // Clients that ask for usage themselves, and unstreamed requests, are forwarded as sent.
  auto asked = chat("{" + rest + R"(,"stream_options":{"include_usage":true}})");
  auto plain = chat(R"({"model":"m","messages":[{"role":"user","content":"x"}]})");
  ASSERT_TRUE(asked && plain);
  EXPECT_FALSE(asked->strip_usage);
  EXPECT_TRUE(asked->upstream_body.empty());
  EXPECT_FALSE(plain->strip_usage);
  EXPECT_TRUE(plain->upstream_body.empty());
}

TEST(Request, BadInputGetsFieldNamedErrors) {
  struct Case {
    Endpoint ep;
    std::string body;
    std::string expect;
  } cases[] = {
      {Endpoint::kChatCompletions, "{not json", "not valid JSON"},
      {Endpoint::kChatCompletions, "[1,2]", "must be a JSON object"},
      {Endpoint::kChatCompletions, R"({"messages":[]})", "'model' is required"},
      {Endpoint::kChatCompletions, R"({"model":5,"messages":[]})", "'model' must be a string"},
      {Endpoint::kChatCompletions, R"({"model":"m"})", "'messages' is required"},
      {Endpoint::kChatCompletions, R"({"model":"m","messages":"hi"})", "'messages' must be an array"},
      {Endpoint::kChatCompletions, R"({"model":"m","messages":[]})", "must not be empty"},
      {Endpoint::kChatCompletions, R"({"model":"m","messages":[{"content":"x"}]})", "messages[0].role"},
      {Endpoint::kChatCompletions, R"({"model":"m","stream":"yes","messages":[{"role":"user","content":"x"}]})", "'stream' must be a boolean"},
      {Endpoint::kChatCompletions, R"({"model":"m","max_tokens":-1,"messages":[{"role":"user","content":"x"}]})", "'max_tokens'"},
      {Endpoint::kCompletions, R"({"model":"m"})", "'prompt' is required"},
      {Endpoint::kCompletions, R"({"model":"m","prompt":{"a":1}})", "'prompt' must be"},
      {Endpoint::kCompletions, R"({"model":"m","prompt":[1,-2]})", "token ids"},
  };
  for (const auto& c : cases) {
    auto r = parse_request(c.ep, c.body, {}, {});
    ASSERT_FALSE(r) << c.body;
    EXPECT_EQ(r.error().status, 400);
    EXPECT_NE(r.error().message.find(c.expect), std::string::npos) << r.error().message;
  }
}

TEST(Request, ErrorJsonIsOpenAIShaped) {
  auto v = boost::json::parse(error_json(make_error("bad", 400, "invalid_request_error", "x")));
  const auto& e = v.at("error").as_object();
  EXPECT_EQ(e.at("message").as_string(), "bad");
  EXPECT_EQ(e.at("type").as_string(), "invalid_request_error");
  EXPECT_EQ(e.at("code").as_string(), "x");
}

TEST(TopLevelModel, FindsTheModelWhereverItIsAtTheTop) {
  EXPECT_EQ(top_level_model(R"({"model":"m1","input":"x"})"), "m1");
  EXPECT_EQ(top_level_model(R"({"input":[[1,2,3],[4,5]],"encoding_format":"float","model":"m2"})"), "m2");
  EXPECT_EQ(top_level_model(" \n{ \"input\" : { \"a\" : [ 1 , { } ] } ,\t\"model\" : \"m3\" } \n"), "m3");
}

TEST(TopLevelModel, NestedModelKeysAreNotTheRequestsModel) {
  EXPECT_EQ(top_level_model(R"({"input":{"model":"inner"}})"), "");
  EXPECT_EQ(top_level_model(R"({"input":[{"model":"inner"}],"model":"outer"})"), "outer");
  EXPECT_EQ(top_level_model(R"({"input":"{\"model\":\"inner\"}","model":"outer"})"), "outer");
}

TEST(TopLevelModel, EscapesInStringsAndKeys) {
  // Quotes and brackets inside strings do not end them or change the depth.
  EXPECT_EQ(top_level_model(R"({"input":"a \"quoted\" ] } [ text \\","model":"m"})"), "m");
  EXPECT_EQ(top_level_model(R"({"\u006dodel":"m"})"), "m");
  EXPECT_EQ(top_level_model(R"({"model":"org\/m\u00e9"})"), "org/m\xc3\xa9");
}

TEST(TopLevelModel, RepeatedKeyCountsLast) {
  EXPECT_EQ(top_level_model(R"({"model":"a","input":"x","model":"b"})"), "b");
  EXPECT_EQ(top_level_model(R"({"model":"a","model":7})"), "");
}

TEST(TopLevelModel, NoModelOrNoObjectGivesEmpty) {
  for (const char* body : {"", "[]", "\"model\"", "{}", R"({"model":null})", R"({"model":["m"]})",
                           R"({"input":"x"})", R"({"model":"m")", R"({"model":"m",})", R"({"model" "m"})",
                           R"({"input":[1,2,"model":"m"})", R"({"model":"m"}})", R"({"model":"unterminated})",
                           R"({"model":"bad escape \q"})"}) {
    EXPECT_EQ(top_level_model(body), "") << body;
  }
}

// The skimmer against a full parse, on random documents with the model key at a random place among nested
// values full of escapes and brackets.
TEST(TopLevelModel, AgreesWithAFullParse) {
  std::mt19937 rng(7);
  const std::vector<std::string> atoms = {"0", "-1.5e3", "true", "null", R"("plain")", R"("q\"uote")",
                                          R"("back\\slash\\")", R"("br]ack}{et[")", R"("u\u00e9")"};
  std::function<std::string(int)> value = [&](int depth) -> std::string {
    const int kind = depth > 3 ? 0 : static_cast<int>(rng() % 3);
    if (kind == 0) return atoms[rng() % atoms.size()];
    std::string out(1, kind == 1 ? '[' : '{');
    const int n = static_cast<int>(rng() % 4);
    for (int i = 0; i < n; ++i) {
      if (i > 0) out += rng() % 2 ? "," : " ,\n ";
      if (kind == 2) out += (rng() % 3 == 0 ? R"("model")" : "\"k" + std::to_string(i) + "\"") + std::string(":");
      out += value(depth + 1);
    }
    return out + (kind == 1 ? ']' : '}');
  };
  int with_model = 0;
  for (int doc = 0; doc < 2000; ++doc) {
    std::string body = "{";
    const int n = 1 + static_cast<int>(rng() % 5);
    const int model_at = static_cast<int>(rng() % (n + 1));  // n: no model key
    for (int i = 0; i < n; ++i) {
      if (i > 0) body += ",";
      if (i == model_at) {
        body += R"("model":)" + (rng() % 4 == 0 ? value(1) : "\"m-" + std::to_string(doc) + "\"");
      } else {
        body += "\"f" + std::to_string(i) + "\":" + value(1);
      }
    }
    body += "}";
    const boost::json::value v = boost::json::parse(body);
    const auto* m = v.as_object().if_contains("model");
    const std::string expected = m && m->is_string() ? std::string(m->as_string()) : std::string();
    with_model += !expected.empty();
    EXPECT_EQ(top_level_model(body), expected) << body;
  }
  EXPECT_GT(with_model, 1000);
}

Result<RoutableRequest> responses(const std::string& body) {
  return parse_request(Endpoint::kResponses, body, {}, {.tokenize = true});
}

TEST(Responses, RoutedAsTheChatMessagesTheyStandFor) {
  const std::string sys(300, 's');
  auto r = responses(R"({"model":"m","instructions":")" + sys + R"(","input":"hello there","max_output_tokens":9})");
  ASSERT_TRUE(r) << r.error().message;
  auto c = chat(R"({"model":"m","messages":[{"role":"system","content":")" + sys +
                R"("},{"role":"user","content":"hello there"}]})");
  ASSERT_TRUE(c);
  EXPECT_EQ(r->chain.hashes, c->chain.hashes);
  EXPECT_EQ(r->max_tokens, 9u);
  EXPECT_EQ(r->affinity_key, c->affinity_key);
  EXPECT_TRUE(r->previous_response_id.empty());
  // The /tokenize call renders the same messages as the chat request would.
  EXPECT_NE(r->tokenize_body.find(R"("messages":[{"role":"system")"), std::string::npos) << r->tokenize_body;

  // Items: input_text parts are text parts, so an item list routes like the equivalent chat.
  auto items = responses(R"({"model":"m","input":[{"type":"message","role":"user",)"
                         R"("content":[{"type":"input_text","text":"hello there"}]}]})");
  auto plain = responses(R"({"model":"m","input":"hello there"})");
  ASSERT_TRUE(items) << items.error().message;
  ASSERT_TRUE(plain);
  EXPECT_EQ(items->chain.hashes, plain->chain.hashes);
}

TEST(Responses, ContinuationsAndStreams) {
  auto r = responses(R"({"model":"m","input":[{"role":"user","content":"a"},)"
                     R"({"type":"function_call_output","call_id":"c1","output":"42"}],)"
                     R"("previous_response_id":"resp_abc","stream":true,)"
                     R"("tools":[{"type":"function","name":"f","parameters":{"type":"object"}},{"type":"web_search"}]})");
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->previous_response_id, "resp_abc");
  EXPECT_TRUE(r->stream);
  EXPECT_FALSE(r->strip_usage);  // the stream ends with its usage anyway
  EXPECT_TRUE(r->upstream_body.empty());
  // Function tools reach /tokenize in the chat shape; built-in tools have none.
  EXPECT_NE(r->tokenize_body.find(R"("tools":[{"type":"function","function":{"name":"f")"), std::string::npos)
      << r->tokenize_body;
  EXPECT_EQ(r->tokenize_body.find("web_search"), std::string::npos);
  EXPECT_FALSE(r->background);
  auto bg = responses(R"({"model":"m","input":"x","background":true})");
  ASSERT_TRUE(bg) << bg.error().message;
  EXPECT_TRUE(bg->background);
}

TEST(Responses, BadInputNamesTheField) {
  for (const auto& [body, field] : std::vector<std::pair<std::string, std::string>>{
           {R"({"model":"m"})", "'input' is required"},
           {R"({"model":"m","input":7})", "'input' must be"},
           {R"({"model":"m","input":[]})", "'input' must not be empty"},
           {R"({"model":"m","input":["x"]})", "'input' items must be objects"},
           {R"({"model":"m","input":"x","instructions":3})", "'instructions' must be a string"},
           {R"({"model":"m","input":"x","previous_response_id":1})", "'previous_response_id' must be a string"},
           {R"({"model":"m","input":"x","max_output_tokens":-1})", "'max_output_tokens'"},
           {R"({"model":"m","input":"x","background":"yes"})", "'background' must be a boolean"},
       }) {
    auto r = responses(body);
    ASSERT_FALSE(r) << body;
    EXPECT_EQ(r.error().status, 400);
    EXPECT_NE(r.error().message.find(field), std::string::npos) << r.error().message;
  }
}

TEST(ResponseId, FromAJsonBodyOrTheFirstEvent) {
  EXPECT_EQ(response_id(R"({"id":"resp_0a1b","object":"response","output":[)", false), "resp_0a1b");
  EXPECT_EQ(response_id(R"({"object":"response","status":"completed","id":"resp_2"})", false), "resp_2");
  EXPECT_EQ(response_id(R"({"object":"resp)", false), std::nullopt);  // not all there yet
  EXPECT_EQ(response_id(R"({"output":[{"id":"msg_1"}]})", false), std::nullopt);
  const std::string created =
      "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,"
      "\"response\":{\"id\":\"resp_9f\",\"object\":\"response\",\"status\":\"in_progress\"}}\n\n";
  EXPECT_EQ(response_id(created, true), "resp_9f");
  EXPECT_EQ(response_id(created.substr(0, created.size() - 4), true), std::nullopt);  // the line is cut
  EXPECT_EQ(response_id("data: {\"type\":\"response.created\",\"response\":{\"status\":\"queued\",\"id\":\"r\\u0031\"}}\n",
                        true),
            "r1");
}

TEST(ResponseId, OutputBeginsAfterTheOpeningEvents) {
  EXPECT_FALSE(responses_output_began("event: response.created\ndata: {}\n\nevent: response.in_progress\ndata: {}\n\n"));
  EXPECT_FALSE(responses_output_began("event: response.output_text.del"));  // cut: read with the next piece
  EXPECT_TRUE(responses_output_began("event: response.created\ndata: {}\n\nevent: response.output_text.delta\r\n"));
  EXPECT_TRUE(responses_output_began("event: response.completed\n"));
}

}  // namespace
}  // namespace kvroute::router
