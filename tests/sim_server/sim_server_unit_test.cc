// Unit tests of kvroute-sim's pieces that need no process: tokenizer, request parsing, response shapes,
// the Responses API store, KV-event encoding, flags.
#include <gtest/gtest.h>

#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>

#include "backends/events/native_events.h"
#include "backends/sim/server/kv_events.h"
#include "backends/sim/server/openai_api.h"
#include "backends/sim/server/options.h"
#include "backends/sim/server/response_store.h"
#include "backends/sim/server/tokenizer.h"

namespace kvroute::sim {
namespace {

namespace json = boost::json;

// A string literal with embedded NUL bytes, as bytes.
template <std::size_t N>
std::string lit(const char (&s)[N]) {
  return std::string(s, N - 1);
}

TEST(SimTokenizer, DeterministicAndInRange) {
  const auto a = tokenize("The quick brown fox jumps over the lazy dog, twice!");
  EXPECT_EQ(a, tokenize("The quick brown fox jumps over the lazy dog, twice!"));
  for (auto t : a) {
    EXPECT_GE(t, kFirstTextToken);
    EXPECT_LT(t, kVocabEnd);
  }
  // Pieces: The, " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog", ",", " twice", "!".
  EXPECT_EQ(a.size(), 12u);
  // A long word is cut into 4-byte chunks: " internationalization" (21 bytes) -> 6 tokens.
  EXPECT_EQ(tokenize(" internationalization").size(), 6u);
  EXPECT_TRUE(tokenize("").empty());
}

TEST(SimTokenizer, PinnedIds) {
  // The recipe is part of the simulator's contract (recorded traces replay to the same blocks).
  const auto a = tokenize("Hello, world!");
  ASSERT_EQ(a.size(), 4u);
  EXPECT_EQ(a, (std::vector<std::uint32_t>{179341271u, 1106731362u, 1660031046u, 89291390u}));
  EXPECT_EQ(tokenize("Hello")[0], a[0]);
  EXPECT_EQ(tokenize(",")[0], a[1]);
  EXPECT_EQ(tokenize(" world")[0], a[2]);
}

TEST(SimTokenizer, ChatTurnIsPrefixOfNextTurn) {
  json::value turn1 = json::parse(R"([{"role":"user","content":"What is a KV cache?"}])");
  json::value turn2 = json::parse(R"([{"role":"user","content":"What is a KV cache?"},
                                      {"role":"assistant","content":" the cache of a model"},
                                      {"role":"user","content":"More."}])");
  auto t1 = render_chat(turn1);
  auto t2 = render_chat(turn2);
  ASSERT_TRUE(t1 && t2);
  ASSERT_GT(t2->size(), t1->size());
  EXPECT_TRUE(std::equal(t1->begin(), t1->end(), t2->begin()));
  EXPECT_FALSE(render_chat(json::parse("[]")));
  EXPECT_FALSE(render_chat(json::parse(R"([{"content":"x"}])")));
}

TEST(SimTokenizer, GeneratedPiecesAreSingleTokens) {
  for (std::uint64_t i = 0; i < 500; ++i) {
    const auto piece = generated_piece(12345, i);
    EXPECT_EQ(tokenize(piece).size(), 1u) << "'" << piece << "'";
  }
  EXPECT_EQ(generated_piece(7, 3), generated_piece(7, 3));
}

TEST(SimOpenAi, ParsesCompletionAndChat) {
  ApiLimits limits{.served_model_name = "m", .alias = "qwen3-8b", .max_model_len = 1000};
  auto r = parse_api_request(ApiKind::kCompletion,
                             R"({"model":"qwen3-8b","prompt":"hi there","max_tokens":5,"stream":true,)"
                             R"("stream_options":{"include_usage":true},"ignore_eos":true,"cache_salt":"t"})",
                             limits);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->prompt_tokens.size(), 2u);
  EXPECT_EQ(r->max_tokens, 5u);
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
  EXPECT_EQ(r->cache_salt, "t");
  auto c = parse_api_request(ApiKind::kChat, R"({"messages":[{"role":"user","content":"x"}]})", limits);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->max_tokens, 16u);  // the default
  auto too_long = parse_api_request(ApiKind::kCompletion, R"({"prompt":"x","max_tokens":1000})", limits);
  ASSERT_FALSE(too_long);
  EXPECT_EQ(too_long.error().status, 400);
  auto wrong_model = parse_api_request(ApiKind::kCompletion, R"({"model":"x","prompt":"x"})", limits);
  ASSERT_FALSE(wrong_model);
  EXPECT_EQ(wrong_model.error().status, 404);
}

TEST(SimOpenAi, ResponsesAreValidJson) {
  ResponseFormatter chat(ApiKind::kChat, "chatcmpl-1", 42, "m\"odel");
  std::string sse;
  chat.sse_role(sse);
  chat.sse_token(sse, " tok\n");
  chat.sse_finish(sse);
  chat.sse_usage(sse, ApiUsage{10, 2, 8});
  ResponseFormatter::sse_done(sse);
  std::size_t events = 0;
  for (std::size_t p = 0; p < sse.size();) {
    ASSERT_EQ(sse.compare(p, 6, "data: "), 0);
    const std::size_t end = sse.find("\n\n", p);
    ASSERT_NE(end, std::string::npos);
    const std::string payload = sse.substr(p + 6, end - p - 6);
    if (payload != "[DONE]") {
      boost::system::error_code ec;
      json::value v = json::parse(payload, ec);
      ASSERT_FALSE(ec) << payload;
      EXPECT_EQ(v.at("model").as_string(), "m\"odel");
    }
    ++events;
    p = end + 2;
  }
  EXPECT_EQ(events, 5u);
  json::value full = json::parse(ResponseFormatter(ApiKind::kCompletion, "cmpl-1", 1, "m").full(" a b", {3, 2, 0}));
  EXPECT_EQ(full.at("usage").at("prompt_tokens_details").at("cached_tokens").as_int64(), 0);
  EXPECT_EQ(full.at("usage").at("total_tokens").as_int64(), 5);
  json::value err = json::parse(error_body(make_error("bad \"x\"", 400)));
  EXPECT_EQ(err.at("error").at("message").as_string(), "bad \"x\"");
}

TEST(SimTokenizer, ContinueChatEqualsTheWholeConversation) {
  // A stored conversation (turn 1's prompt + its generated output tokens) continued by the next turn gives
  // the tokens of the whole conversation rendered through the chat template, and keeps turn 1 as a prefix.
  auto turn1 = render_chat(json::parse(R"([{"role":"user","content":"What is a KV cache?"}])"));
  ASSERT_TRUE(turn1);
  std::string output;
  for (std::uint64_t i = 0; i < 12; ++i) output += generated_piece(99, i);
  std::vector<std::uint32_t> history = *turn1;
  tokenize_append(output, history);
  ASSERT_EQ(history.size(), turn1->size() + 12);  // one token per generated piece
  auto next = render_chat(json::parse(R"([{"role":"user","content":"More."}])"));
  ASSERT_TRUE(next);
  json::array whole = {json::object{{"role", "user"}, {"content", "What is a KV cache?"}},
                       json::object{{"role", "assistant"}, {"content", output}},
                       json::object{{"role", "user"}, {"content", "More."}}};
  auto expected = render_chat(whole);
  ASSERT_TRUE(expected);
  const auto got = continue_chat(history, *next);
  EXPECT_EQ(got, *expected);
  EXPECT_TRUE(std::equal(history.begin(), history.end(), got.begin()));
}

TEST(SimOpenAi, ParsesResponsesRequests) {
  ApiLimits limits{.served_model_name = "m", .alias = "qwen3-8b", .max_model_len = 1000};
  auto user = [](const char* text) { return *render_chat(json::array{json::object{{"role", "user"}, {"content", text}}}); };

  // A string input is one user message; defaults: 16 output tokens, store, no stream, no previous response.
  auto s = parse_responses_request(R"({"model":"m","input":"Hello there","temperature":0.2,"tools":[]})", limits);
  ASSERT_TRUE(s) << s.error().message;
  EXPECT_EQ(s->api.prompt_tokens, user("Hello there"));
  EXPECT_EQ(s->api.kind, ApiKind::kChat);
  EXPECT_EQ(s->api.max_tokens, 16u);
  EXPECT_FALSE(s->api.stream);
  EXPECT_TRUE(s->store);
  EXPECT_FALSE(s->previous_response_id.has_value());

  // Instructions come first, as a system message; fields.
  auto f = parse_responses_request(R"({"model":"qwen3-8b","instructions":"Be brief.","input":"Hi",)"
                                   R"("max_output_tokens":7,"stream":true,"store":false,)"
                                   R"("previous_response_id":"resp_abc","cache_salt":"t"})",
                                   limits);
  ASSERT_TRUE(f) << f.error().message;
  EXPECT_EQ(f->api.prompt_tokens, *render_chat(json::parse(
                                      R"([{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}])")));
  EXPECT_EQ(f->api.max_tokens, 7u);
  EXPECT_TRUE(f->api.stream);
  EXPECT_FALSE(f->store);
  EXPECT_EQ(f->previous_response_id.value_or(""), "resp_abc");
  EXPECT_EQ(f->api.cache_salt, "t");

  // Items: messages of every role with string or part contents (text parts concatenated), and any other
  // item as a message whose role is its type and whose content is its canonical JSON (keys sorted).
  auto items = parse_responses_request(
      R"({"input":[{"role":"developer","content":"Rules."},)"
      R"({"type":"message","role":"user","content":[{"type":"input_text","text":"Look "},{"type":"input_text","text":"here"}]},)"
      R"({"role":"assistant","content":[{"type":"output_text","text":"Done."}]},)"
      R"({"type":"function_call_output","output":"42","call_id":"c1"}]})",
      limits);
  ASSERT_TRUE(items) << items.error().message;
  EXPECT_EQ(items->api.prompt_tokens,
            *render_chat(json::parse(R"([{"role":"developer","content":"Rules."},{"role":"user","content":"Look here"},)"
                                     R"({"role":"assistant","content":"Done."},)"
                                     R"({"role":"function_call_output",)"
                                     R"("content":"{\"call_id\":\"c1\",\"output\":\"42\",\"type\":\"function_call_output\"}"}])")));
}

TEST(SimOpenAi, RejectsBadResponsesRequests) {
  ApiLimits limits{.served_model_name = "m", .alias = "", .max_model_len = 1000};
  auto error = [&](const std::string& body) {
    auto r = parse_responses_request(body, limits);
    EXPECT_FALSE(r) << body;
    return r ? Error{} : r.error();
  };
  auto bad = [&](const std::string& body, const std::string& message) {
    const Error e = error(body);
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_NE(e.message.find(message), std::string::npos) << body << " -> " << e.message;
  };
  bad("{not json", "not valid JSON");
  bad(R"({"model":"m"})", "'input' is required");
  bad(R"({"input":""})", "'input' must not be empty");
  bad(R"({"input":[]})", "'input' must not be empty");
  bad(R"({"input":42})", "'input' must be a string or an array");
  bad(R"({"input":["hi"]})", "input[0] must be an object");
  bad(R"({"input":[{"role":"tool","content":"x"}]})", "input[0].role must be one of");
  bad(R"({"input":[{"role":"user","content":"a"},{"role":"user"}]})", "input[1].content must be a string or an array");
  bad(R"({"input":[{"role":"user","content":["x"]}]})", "input[0].content parts must be objects");
  bad(R"({"input":[{"role":"user","content":[{"type":"input_text"}]}]})", "must have a string 'text'");
  bad(R"({"input":[{"call_id":"c1"}]})", "input[0] must have a 'role' or a string 'type'");
  bad(R"({"input":"x","instructions":["a"]})", "'instructions' must be a string");
  bad(R"({"input":"x","max_output_tokens":0})", "'max_output_tokens' must be an integer >= 1");
  bad(R"({"input":"x","max_output_tokens":"many"})", "'max_output_tokens' must be an integer >= 1");
  bad(R"({"input":"x","previous_response_id":7})", "'previous_response_id' must be a string");
  bad(R"({"input":"x","store":"yes"})", "'store' must be a boolean");
  bad(R"({"input":"x","stream":1})", "'stream' must be a boolean");
  bad(R"({"input":"x","background":"yes"})", "'background' must be a boolean");
  bad(R"({"input":"x","background":true,"store":false})", "background can only be used when `store` is true");
  bad(R"({"input":"x","background":true,"stream":true})", "does not support stream=true with background=true");
  auto bg = parse_responses_request(R"({"input":"x","background":true,"store":null})", limits);
  ASSERT_TRUE(bg);  // a null store is the default, true
  EXPECT_TRUE(bg->background);
  const Error model = error(R"({"model":"other","input":"x"})");
  EXPECT_EQ(model.status, 404);
  EXPECT_EQ(model.code, "model_not_found");

  // The context length is checked once the full prompt is known (after the stored conversation).
  auto r = parse_responses_request(R"({"input":"x","max_output_tokens":999})", limits);
  ASSERT_TRUE(r);
  auto too_long = check_context_length(r->api, limits);
  ASSERT_TRUE(too_long.has_value());
  EXPECT_EQ(too_long->status, 400);
  EXPECT_NE(too_long->message.find("maximum context length is 1000"), std::string::npos);

  json::value nf = json::parse(error_body(response_not_found("resp_x")));
  EXPECT_EQ(nf.at("error").at("message").as_string(), "Response with id 'resp_x' not found.");
  EXPECT_EQ(nf.at("error").at("type").as_string(), "invalid_request_error");
  EXPECT_EQ(nf.at("error").at("code").as_int64(), 404);
}

TEST(SimOpenAi, ResponsesObjectsAndEvents) {
  ResponsesFormatter f("resp_0123", "msg_4567", 1790000000, "m\"odel");
  const std::string done = f.completed(" the cache\n", ApiUsage{40, 3, 32});
  EXPECT_EQ(done.rfind(R"({"id":"resp_0123",)", 0), 0u) << done;  // "id" is the first key
  json::value v = json::parse(done);
  EXPECT_EQ(v.at("object").as_string(), "response");
  EXPECT_EQ(v.at("created_at").as_int64(), 1790000000);
  EXPECT_EQ(v.at("model").as_string(), "m\"odel");
  EXPECT_EQ(v.at("status").as_string(), "completed");
  const auto& item = v.at("output").at(0);
  EXPECT_EQ(item.at("type").as_string(), "message");
  EXPECT_EQ(item.at("id").as_string(), "msg_4567");
  EXPECT_EQ(item.at("role").as_string(), "assistant");
  EXPECT_EQ(item.at("status").as_string(), "completed");
  EXPECT_EQ(item.at("content").at(0).at("type").as_string(), "output_text");
  EXPECT_EQ(item.at("content").at(0).at("text").as_string(), " the cache\n");
  EXPECT_TRUE(item.at("content").at(0).at("annotations").as_array().empty());
  const auto& u = v.at("usage");
  EXPECT_EQ(u.at("input_tokens").as_int64(), 40);
  EXPECT_EQ(u.at("input_tokens_details").at("cached_tokens").as_int64(), 32);
  EXPECT_EQ(u.at("output_tokens").as_int64(), 3);
  EXPECT_EQ(u.at("output_tokens_details").at("reasoning_tokens").as_int64(), 0);
  EXPECT_EQ(u.at("total_tokens").as_int64(), 43);

  std::string sse;
  f.sse_created(sse);
  f.sse_delta(sse, " the");
  f.sse_delta(sse, " cache\n");
  f.sse_completed(sse, " the cache\n", done);
  // vLLM's order: created and in_progress, the item and its part opened with the first token, the deltas,
  // then text, part and item done, and completed.
  const std::vector<std::string> types = {"response.created",           "response.in_progress",
                                          "response.output_item.added", "response.content_part.added",
                                          "response.output_text.delta", "response.output_text.delta",
                                          "response.output_text.done",  "response.content_part.done",
                                          "response.output_item.done",  "response.completed"};
  std::size_t p = 0;
  for (std::size_t k = 0; k < types.size(); ++k) {
    const std::string head = "event: " + types[k] + "\ndata: ";
    ASSERT_EQ(sse.compare(p, head.size(), head), 0) << sse.substr(p);
    const std::size_t end = sse.find("\n\n", p);
    ASSERT_NE(end, std::string::npos);
    json::value e = json::parse(sse.substr(p + head.size(), end - p - head.size()));
    EXPECT_EQ(e.at("type").as_string(), types[k]);
    EXPECT_EQ(e.at("sequence_number").as_int64(), static_cast<std::int64_t>(k));
    if (k < 2) {
      EXPECT_EQ(e.at("response").at("id").as_string(), "resp_0123");
      EXPECT_EQ(e.at("response").at("status").as_string(), "in_progress");
      EXPECT_TRUE(e.at("response").at("output").as_array().empty());
      EXPECT_TRUE(e.at("response").at("usage").is_null());
    } else if (k == 2) {
      EXPECT_EQ(e.at("output_index").as_int64(), 0);
      EXPECT_EQ(e.at("item").at("id").as_string(), "msg_4567");
      EXPECT_EQ(e.at("item").at("status").as_string(), "in_progress");
      EXPECT_TRUE(e.at("item").at("content").as_array().empty());
    } else if (k == 8) {
      EXPECT_EQ(e.at("item"), v.at("output").at(0));
    } else if (k == 9) {
      EXPECT_EQ(e.at("response"), v);
    } else {
      EXPECT_EQ(e.at("item_id").as_string(), "msg_4567");
      EXPECT_EQ(e.at("output_index").as_int64(), 0);
      EXPECT_EQ(e.at("content_index").as_int64(), 0);
      if (k == 6) {
        EXPECT_EQ(e.at("text").as_string(), " the cache\n");
      }
      if (k == 3 || k == 7) {
        EXPECT_EQ(e.at("part").at("text").as_string(), k == 3 ? "" : " the cache\n");
      }
    }
    p = end + 2;
  }
  EXPECT_EQ(p, sse.size());
  EXPECT_EQ(sse.find("[DONE]"), std::string::npos);
}

TEST(SimResponseStore, KeepsTheNewestAndMakesRandomIds) {
  ResponseStore store(3);
  for (int i = 0; i < 4; ++i) store.put("r" + std::to_string(i), StoredResponse::completed({std::uint32_t(i)}, "{}"));
  EXPECT_EQ(store.size(), 3u);
  EXPECT_EQ(store.find("r0"), nullptr);  // the oldest went
  ASSERT_NE(store.find("r3"), nullptr);
  EXPECT_EQ(store.find("r3")->conversation, std::vector<std::uint32_t>{3});
  store.put("r1", StoredResponse::completed({9}, "{\"x\":1}"));  // replaced in place; nothing dropped
  EXPECT_EQ(store.size(), 3u);
  EXPECT_EQ(store.find("r1")->object, "{\"x\":1}");
  EXPECT_EQ(ResponseStore::kDefaultCapacity, 4096u);

  ResponseStore other;
  const std::string a = store.new_id("resp_");
  const std::string b = other.new_id("resp_");
  for (const std::string& id : {a, b}) {
    ASSERT_EQ(id.size(), 5u + 32u) << id;
    EXPECT_EQ(id.substr(0, 5), "resp_");
    EXPECT_EQ(id.find_first_not_of("0123456789abcdef", 5), std::string::npos) << id;
  }
  EXPECT_NE(a, b);  // independently seeded generators
  EXPECT_NE(store.new_id("msg_"), store.new_id("msg_"));
}

TEST(SimKvEvents, PositionalBatchBytes) {
  KvEventBatch batch(KvEventEncoding::kPositional);
  const std::uint64_t hashes[] = {0xffffffffffffffffull};  // -1 as int64
  const std::uint32_t tokens[] = {1, 2};
  batch.stored(hashes, std::nullopt, tokens, 16, "GPU");
  batch.cleared();
  const std::string bytes = batch.encode(1.5, 0);
  const std::string expected = lit(
      "\x93"                                  // [ts, events, rank]
      "\xcb\x3f\xf8\x00\x00\x00\x00\x00\x00"  // 1.5
      "\x92"                                  // two events
      "\x98\xab" "BlockStored" "\x91\xff" "\xc0" "\x92\x01\x02" "\x10" "\xc0" "\xa3" "GPU" "\xc0"
      "\x91\xb0" "AllBlocksCleared"
      "\x00");
  EXPECT_EQ(bytes, expected);
  EXPECT_EQ(encode_seq(-1), std::string(8, '\xff'));
  EXPECT_EQ(encode_seq(258), std::string("\0\0\0\0\0\0\x01\x02", 8));
}

TEST(SimKvEvents, MapBatchBytes) {
  KvEventBatch batch(KvEventEncoding::kMap);
  const std::uint64_t hashes[] = {5};
  batch.removed(hashes, "CPU");
  const std::string bytes = batch.encode(0.0, 0);
  const std::string expected = lit(
      "\x83\xa2ts\xcb\0\0\0\0\0\0\0\0"
      "\xa6" "events" "\x91"
      "\x83\xa4type\xac" "BlockRemoved" "\xac" "block_hashes" "\x91\x05" "\xa6" "medium" "\xa3" "CPU"
      "\xb2" "data_parallel_rank" "\0");
  EXPECT_EQ(bytes, expected);
}

TEST(SimKvEvents, NativeBatchDecodesWithTheRoutersDecoder) {
  KvEventBatch batch(KvEventEncoding::kNative);
  const std::uint64_t hashes[] = {0xffffffffffffffffull, 7};
  std::vector<std::uint32_t> tokens(32);
  for (std::uint32_t i = 0; i < 32; ++i) tokens[i] = 1000 + i;
  batch.stored(hashes, std::nullopt, tokens, 16, "GPU");
  const std::uint64_t child[] = {9};
  batch.stored(child, 7, std::span(tokens).first(16), 16, "CPU");
  batch.removed(child, "CPU");
  batch.cleared();
  EXPECT_EQ(batch.size(), 4u);
  events::WorkerTelemetry load;
  load.running = 3;
  load.waiting = 1;
  load.kv_usage = 0.25;
  load.num_gpu_blocks = 200;
  load.block_size = 16;
  const std::string bytes = batch.encode(1.5, 0, &load, 42);

  events::NativeDecoder dec;
  events::KvEventBatch out;
  std::optional<events::WorkerTelemetry> got;
  const auto* p = reinterpret_cast<const std::uint8_t*>(bytes.data());
  ASSERT_TRUE(dec.decode({p, bytes.size()}, events::DecodeLimits{}, out, got));
  EXPECT_DOUBLE_EQ(out.ts, 1.5);
  EXPECT_EQ(out.data_parallel_rank, 0);
  ASSERT_EQ(out.events.size(), 4u);
  EXPECT_EQ(out.events[0].type, events::KvEventType::kBlockStored);
  EXPECT_FALSE(out.events[0].has_parent);
  EXPECT_EQ(out.events[0].medium, events::Medium::kGpu);
  EXPECT_EQ(out.events[0].block_size, 16u);
  EXPECT_EQ(std::vector<std::uint64_t>(out.hashes_of(out.events[0]).begin(), out.hashes_of(out.events[0]).end()),
            std::vector<std::uint64_t>(std::begin(hashes), std::end(hashes)));
  EXPECT_EQ(std::vector<std::uint32_t>(out.tokens_of(out.events[0]).begin(), out.tokens_of(out.events[0]).end()),
            tokens);
  EXPECT_TRUE(out.events[1].has_parent);
  EXPECT_EQ(out.events[1].parent_block_hash, 7u);
  EXPECT_EQ(out.events[1].medium, events::Medium::kCpu);
  EXPECT_EQ(out.events[2].type, events::KvEventType::kBlockRemoved);
  EXPECT_EQ(out.events[2].medium, events::Medium::kCpu);
  EXPECT_EQ(out.events[3].type, events::KvEventType::kAllBlocksCleared);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->running, 3.0);
  EXPECT_EQ(got->waiting, 1.0);
  EXPECT_EQ(got->kv_usage, 0.25);
  EXPECT_EQ(got->num_gpu_blocks, 200u);
  EXPECT_EQ(got->block_size, 16u);
  EXPECT_FALSE(got->num_cpu_blocks.has_value());  // 0 on the wire: no CPU tier

  // A load-only batch (the periodic report) is a valid EventBatch with no block events.
  KvEventBatch empty(KvEventEncoding::kNative);
  const std::string only = empty.encode(2.0, 0, &load);
  ASSERT_TRUE(dec.decode({reinterpret_cast<const std::uint8_t*>(only.data()), only.size()}, events::DecodeLimits{},
                         out, got));
  EXPECT_TRUE(out.events.empty());
  EXPECT_TRUE(got.has_value());
}

TEST(SimOptions, NativeFormatFlags) {
  auto o = parse_sim_options({"--kv-events-port", "5557", "--kv-events-format", "native"});
  ASSERT_TRUE(o) << o.error().message;
  EXPECT_EQ(o->kv_events_format, KvEventsFormat::kNative);
  EXPECT_EQ(o->kv_events_encoding, KvEventEncoding::kNative);
  EXPECT_EQ(o->kv_events_topic, "kvroute.v1");  // the prefix routers select the native decoder by
  EXPECT_DOUBLE_EQ(o->kv_events_load_interval_s, 1.0);
  o = parse_sim_options({"--kv-events-format=native", "--kv-events-topic", "kvroute.v1.w0",
                         "--kv-events-load-interval", "0.5"});
  ASSERT_TRUE(o) << o.error().message;
  EXPECT_EQ(o->kv_events_topic, "kvroute.v1.w0");
  EXPECT_DOUBLE_EQ(o->kv_events_load_interval_s, 0.5);
  o = parse_sim_options({});
  ASSERT_TRUE(o);
  EXPECT_EQ(o->kv_events_format, KvEventsFormat::kVllm);
  EXPECT_TRUE(o->kv_events_topic.empty());
  EXPECT_FALSE(parse_sim_options({"--kv-events-format", "protobuf"}));
  EXPECT_FALSE(parse_sim_options({"--kv-events-format", "native", "--kv-events-topic", "events"}));
  EXPECT_FALSE(parse_sim_options({"--kv-events-format", "native", "--kv-events-encoding", "map"}));
  EXPECT_FALSE(parse_sim_options({"--kv-events-topic", "kvroute.v1"}));  // vLLM msgpack under a native topic
  EXPECT_FALSE(parse_sim_options({"--kv-events-load-interval", "0"}));
}

TEST(SimOptions, ParsesFlags) {
  auto o = parse_sim_options({"--port", "9000", "--workers=3", "--speed", "50", "--kv-events-port", "5557",
                              "--kv-events-encoding", "map", "--num-gpu-blocks", "100", "--seed", "7"});
  ASSERT_TRUE(o) << o.error().message;
  EXPECT_EQ(o->port, 9000);
  EXPECT_EQ(o->workers, 3);
  EXPECT_DOUBLE_EQ(o->speed, 50);
  EXPECT_EQ(o->kv_events_replay_port, 5560);  // right after the PUB range
  EXPECT_EQ(o->kv_events_encoding, KvEventEncoding::kMap);
  EXPECT_EQ(*o->num_gpu_blocks, 100u);
  EXPECT_FALSE(parse_sim_options({"--port"}));
  EXPECT_FALSE(parse_sim_options({"--port", "0"}));
  EXPECT_FALSE(parse_sim_options({"--speed", "fast"}));
  EXPECT_FALSE(parse_sim_options({"--frobnicate", "1"}));
  EXPECT_FALSE(parse_sim_options({"positional"}));
}

TEST(SimOptions, LoraModulesAreNamePathPairs) {
  auto o = parse_sim_options({"--lora-modules", "sql=/adapters/sql,chat=/a/chat"});
  ASSERT_TRUE(o) << o.error().message;
  ASSERT_EQ(o->lora_modules.size(), 2u);
  EXPECT_EQ(o->lora_modules[0], std::make_pair(std::string("sql"), std::string("/adapters/sql")));
  EXPECT_EQ(o->lora_modules[1], std::make_pair(std::string("chat"), std::string("/a/chat")));
  for (const char* bad : {"sql", "=/p", "sql=", "sql=/p,,chat=/c", "sql=/p,"}) {
    auto e = parse_sim_options({"--lora-modules", bad});
    ASSERT_FALSE(e) << bad;
    EXPECT_NE(e.error().message.find("is not NAME=PATH"), std::string::npos) << e.error().message;
  }
}

}  // namespace
}  // namespace kvroute::sim
