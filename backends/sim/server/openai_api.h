// The OpenAI-compatible request and response shapes of kvroute-sim, as vLLM serves them.
//
// Parsing turns a JSON body into an ApiRequest (prompt token ids, limits, streaming flags) or an Error
// carrying the HTTP status and OpenAI error fields. Formatting writes vLLM's JSON: completions and chat
// completions, non-streaming bodies and SSE chunks ("data: {json}\n\n" ... "data: [DONE]\n\n"); and the
// Responses API (POST /v1/responses), whose objects and named SSE events have a formatter of their own.
//
// Facts kept from vLLM:
//   - usage.prompt_tokens_details.cached_tokens is always present (vLLM needs
//     --enable-prompt-tokens-details; the simulator behaves as if it were given).
//   - with stream_options.include_usage the last chunk before [DONE] has "choices": [] and the usage.
//   - the generator never emits EOS, so finish_reason is always "length" and ignore_eos changes nothing.
//   - Responses API: stored responses live in the memory of the server that made them, so a request with
//     previous_response_id works only there; elsewhere it gets 404 "Response with id '...' not found.".
//     The follow-up's prompt is the stored conversation (earlier prompt + output) then the new turn, so the
//     earlier conversation is a token prefix that the prefix cache hits. `store` defaults to true.
//   - Responses API streaming: named events ("event: TYPE\ndata: {json}\n\n") carrying a sequence_number
//     from 0, in vLLM's order: response.created and response.in_progress at once; with the first token
//     response.output_item.added and response.content_part.added; response.output_text.delta per token;
//     then response.output_text.done, response.content_part.done, response.output_item.done and
//     response.completed with the usage; no [DONE].
//
//   auto req = parse_api_request(ApiKind::kChat, body_text, limits);
//   if (!req) return error_body(req.error());
//   ResponseFormatter f(*req, "chatcmpl-42", created, model);
//   out += f.sse_token(" cache");
//   auto rr = parse_responses_request(body_text, limits);   // + continue_chat() when previous_response_id is set
//   ResponsesFormatter rf("resp_..", "msg_..", created, model);
//   rf.sse_created(out);
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "util/result.h"

namespace kvroute::sim {

enum class ApiKind { kCompletion, kChat };

struct ApiLimits {
  std::string served_model_name;      // requests naming another model get 404 model_not_found
  std::string alias;                  // a second accepted name (the --model profile name)
  std::uint32_t max_model_len = 0;    // prompt + max_tokens must fit
  std::uint32_t default_max_tokens = 16;  // OpenAI's default for completions; used when max_tokens is absent
  // The worker's loaded LoRA adapters (names): requests may name one as their model. Owned by the worker.
  const std::vector<std::string>* lora_adapters = nullptr;
};

struct ApiRequest {
  ApiKind kind = ApiKind::kCompletion;
  std::vector<std::uint32_t> prompt_tokens;
  std::uint32_t max_tokens = 16;
  bool stream = false;
  bool include_usage = false;
  std::string cache_salt;  // vLLM's per-request cache namespace
  std::string lora;        // the LoRA adapter the request names as its model; empty: the base model
};

struct ApiUsage {
  std::uint64_t prompt_tokens = 0;
  std::uint64_t completion_tokens = 0;
  std::uint64_t cached_tokens = 0;
};

Result<ApiRequest> parse_api_request(ApiKind kind, std::string_view body, const ApiLimits& limits);

// The 400 vLLM gives when prompt + max_tokens exceed max_model_len (checked by parse_api_request; a Responses
// request is checked again once the stored conversation is in front of its prompt).
std::optional<Error> check_context_length(const ApiRequest& req, const ApiLimits& limits);

// POST /v1/responses. `api.prompt_tokens` holds only the rendering of instructions + input (chat template,
// generation prompt included): a request with previous_response_id is completed by continue_chat() with the
// conversation stored under that id. api.kind is kChat (the request is a chat turn to the engine).
struct ResponsesRequest {
  ApiRequest api;
  std::optional<std::string> previous_response_id;
  bool store = true;
  bool background = false;  // answer at once with status "queued"; poll with GET (needs store; no stream here)
};
Result<ResponsesRequest> parse_responses_request(std::string_view body, const ApiLimits& limits);

// POST /v1/load_lora_adapter and /v1/unload_lora_adapter: {"lora_name", "lora_path"} (absent fields empty).
struct LoraRequest {
  std::string name;
  std::string path;
};
Result<LoraRequest> parse_lora_request(std::string_view body);

// 404 "Response with id 'ID' not found." (vLLM's text), for an unknown previous_response_id or GET.
Error response_not_found(std::string_view id);

// POST /tokenize: {"prompt": "..."} or {"messages": [...]} (optional "model").
Result<std::vector<std::uint32_t>> parse_tokenize_request(std::string_view body, const ApiLimits& limits);
std::string tokenize_response(const std::vector<std::uint32_t>& tokens, std::uint32_t max_model_len);

// {"error": {"message", "type", "code"}} (code is the HTTP status when the error has no code of its own).
std::string error_body(const Error& e);

// Appends s as a JSON string literal (with quotes).
void append_json_string(std::string& out, std::string_view s);

// Formats the responses of one request. Holds preformatted JSON prefixes so that a streamed token costs a
// couple of appends.
class ResponseFormatter {
 public:
  ResponseFormatter(ApiKind kind, std::string id, std::int64_t created, std::string_view model);

  // SSE: the chat role chunk (chat only; empty for completions), one chunk per token, the final chunk with
  // finish_reason, the usage chunk, and [DONE].
  void sse_role(std::string& out) const;
  void sse_token(std::string& out, std::string_view text) const;
  void sse_finish(std::string& out) const;
  void sse_usage(std::string& out, const ApiUsage& u) const;
  static void sse_done(std::string& out);
  // The whole non-streaming body.
  std::string full(std::string_view text, const ApiUsage& u) const;

 private:
  void append_head(std::string& out, std::string_view object) const;

  ApiKind kind_;
  std::string head_id_;    // {"id":"..","object":
  std::string head_rest_;  // ,"created":..,"model":"..","choices":[
};

void append_usage(std::string& out, const ApiUsage& u);

// Formats one Responses API response: the response object ("id" first, as clients that sniff it expect) and
// the named SSE events. The events number themselves: every sse_* call takes the next sequence_number.
//
//   ResponsesFormatter f("resp_..", "msg_..", created_at, model);
//   f.sse_created(out);  f.sse_delta(out, " cache");  f.sse_completed(out, text, f.completed(text, usage));
class ResponsesFormatter {
 public:
  ResponsesFormatter(std::string id, std::string_view message_id, std::int64_t created_at, std::string_view model);

  const std::string& id() const { return id_; }
  // The object with status "in_progress", no output and "usage": null (what response.created carries).
  std::string in_progress() const { return without_output("in_progress"); }
  // The object with `status` (queued, in_progress, cancelled), no output and "usage": null.
  std::string without_output(std::string_view status) const;
  // The finished object: status "completed", one assistant message with `text`, and the usage.
  std::string completed(std::string_view text, const ApiUsage& u) const;

  void sse_created(std::string& out);
  void sse_delta(std::string& out, std::string_view text);
  void sse_completed(std::string& out, std::string_view text, std::string_view completed_object);

 private:
  void append_event(std::string& out, std::string_view type);  // "event: T\ndata: {"type":"T","sequence_number":N

  std::string id_;
  std::string head_;        // {"id":"resp_..","object":"response","created_at":..,"model":"..","status":
  std::string item_head_;   // {"type":"message","id":"msg_..","role":"assistant","status":"completed","content":
  std::string delta_head_;  // ,"item_id":"msg_..","output_index":0,"content_index":0,"delta":
  std::uint64_t seq_ = 0;
  bool opened_ = false;  // the message item and its text part have been announced (first delta)
  // The ends of item_head_ and delta_head_ that the "added" and "done" events leave out.
  static constexpr std::string_view kCompletedTail = "\"completed\",\"content\":";
  static constexpr std::string_view kDeltaKey = ",\"delta\":";
};

}  // namespace kvroute::sim
