// The OpenAI-compatible request and response shapes of kvroute-sim, as vLLM serves them.
//
// Parsing turns a JSON body into an ApiRequest (prompt token ids, limits, streaming flags) or an Error
// carrying the HTTP status and OpenAI error fields. Formatting writes vLLM's JSON: completions and chat
// completions, non-streaming bodies and SSE chunks ("data: {json}\n\n" ... "data: [DONE]\n\n").
//
// Facts kept from vLLM:
//   - usage.prompt_tokens_details.cached_tokens is always present (vLLM needs
//     --enable-prompt-tokens-details; the simulator behaves as if it were given).
//   - with stream_options.include_usage the last chunk before [DONE] has "choices": [] and the usage.
//   - the generator never emits EOS, so finish_reason is always "length" and ignore_eos changes nothing.
//
//   auto req = parse_api_request(ApiKind::kChat, body_text, limits);
//   if (!req) return error_body(req.error());
//   ResponseFormatter f(*req, "chatcmpl-42", created, model);
//   out += f.sse_token(" cache");
#pragma once

#include <cstdint>
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
};

struct ApiRequest {
  ApiKind kind = ApiKind::kCompletion;
  std::vector<std::uint32_t> prompt_tokens;
  std::uint32_t max_tokens = 16;
  bool stream = false;
  bool include_usage = false;
  std::string cache_salt;  // vLLM's per-request cache namespace
};

struct ApiUsage {
  std::uint64_t prompt_tokens = 0;
  std::uint64_t completion_tokens = 0;
  std::uint64_t cached_tokens = 0;
};

Result<ApiRequest> parse_api_request(ApiKind kind, std::string_view body, const ApiLimits& limits);

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

}  // namespace kvroute::sim
