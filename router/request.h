// Request parsing: an OpenAI request body to what routing needs (architecture section 2, step "parse").
//
// The body is parsed once; the result carries the block chain (docs/hashing.md), the session key, the
// namespace and what baselines hash. Every error is an OpenAI-shaped 4xx naming the offending field.
//
//   auto r = parse_request(Endpoint::kChat, body, {.session = hdr_session, .tenant = hdr_tenant}, opts);
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hashing/block_chain.h"
#include "util/result.h"

namespace kvroute::router {

// kResponses: the Responses API (POST /v1/responses). Its `instructions` and `input` are routed as the chat
// messages they stand for (instructions a system message, a string input one user message, input items
// messages of their roles); `previous_response_id` names a response stored on the worker that made it.
enum class Endpoint { kChatCompletions, kCompletions, kResponses };

struct RequestHeaders {
  std::string_view session;  // value of the configured session header, if any
  std::string_view tenant;   // value of the configured tenant header, if any
  std::string_view priority; // value of the configured priority header, if any
};

struct ParseOptions {
  std::uint32_t block_tokens = hashing::kDefaultBlockTokens;
  std::uint32_t block_bytes = hashing::kDefaultBlockBytes;
  bool tokenize = false;  // text requests also get the body of a /tokenize call (tokenize_body)
};

// Tenant isolation on the workers (router/cache_salt.h): the body sent on carries the tenant's cache_salt,
// keyed with `secret` (--tenant-salt-secret), in place of any the client sent; with allow_client_cache_salt
// the client's salt is mixed into it instead of being dropped.
struct SaltOptions {
  std::string_view secret;
  bool allow_client_cache_salt = false;
};

struct RoutableRequest {
  Endpoint endpoint = Endpoint::kChatCompletions;
  std::string model;
  bool stream = false;
  bool include_usage = false;      // stream_options.include_usage as the client sent it
  std::uint32_t max_tokens = 0;    // 0: not given
  std::string session_key;         // header, else the OpenAI `user` field; empty: no session
  std::string previous_response_id;  // Responses API: the stored response this request continues
  bool background = false;         // Responses API: answered at once ("queued"); the worker runs it later
  // May be refused (429) while every worker that could serve it is saturated: the priority header says
  // "sheddable", or the body asks for OpenAI's "flex" service tier (which may answer 429 when capacity is short).
  bool sheddable = false;
  std::string namespace_salt;      // the worker-side cache_salt (router/cache_salt.h); empty: shared namespace
  std::string affinity_key;        // model + first 100 characters of the first user message (or prompt)
  hashing::BlockChain chain;
  std::uint64_t prompt_tokens = 0; // exact for token-id prompts, estimated for text
  // A streamed request whose client did not ask for usage: the router asks the worker for it anyway
  // (upstream_body is the rewritten body) and removes the extra usage event from what the client receives.
  bool strip_usage = false;
  std::string upstream_body;       // empty: forward the client's body unchanged (no usage asked, no salt)
  // With ParseOptions::tokenize, for text prompts: the body to POST to a worker's /tokenize (vLLM's shape)
  // and its hash (the tokenize cache's key). Empty when the request already carries token ids.
  std::string tokenize_body;
  std::uint64_t tokenize_key = 0;
};

// Replaces a text chain by the chain over the worker's token ids (same namespace root).
void use_token_ids(RoutableRequest& request, const std::vector<std::uint32_t>& tokens, std::uint32_t block_tokens);

Result<RoutableRequest> parse_request(Endpoint endpoint, std::string_view body, const RequestHeaders& headers,
                                      const ParseOptions& options, const SaltOptions& salt = {});

// The top-level "model" of a JSON object body, found without building the document: nested values are
// skipped over (strings, brackets and nothing else looked at), so a 1 MB embeddings body costs a scan, not a
// parse (kvroute-routing-bench BM_TopLevelModel). A repeated key counts last, as the workers' JSON readers
// take it. Empty when the body is not an object, its top level is malformed, or "model" is absent or not a
// string: a passed-through request that names no model goes to any worker, whose answer then says what is
// wrong. Values below the top level are not validated.
std::string top_level_model(std::string_view body);

// The id of a Responses API response, read from the first bytes of its body: the top-level "id" of a JSON
// body, or the "id" of the "response" object in the first server-sent event (response.created). nullopt when
// those bytes have not all arrived yet, or hold no id.
std::optional<std::string> response_id(std::string_view head, bool event_stream);

// Whether a Responses API event stream has begun its output: an event other than response.created,
// response.in_progress or response.queued, which a server sends before the prompt is computed. The first
// such event is the stream's first token, for the TTFT the router measures and learns from.
bool responses_output_began(std::string_view events);

// {"error":{"message":...,"type":...,"code":...}} as OpenAI sends it.
std::string error_json(const Error& e);

}  // namespace kvroute::router
