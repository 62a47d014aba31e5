// find_usage: the `usage` of an OpenAI response, read from the response's end (a JSON body's last bytes, or
// the last server-sent events), so that the router learns what the worker computed and had cached.
//
//   std::optional<Usage> u = find_usage(R"({"choices":[...],"usage":{"prompt_tokens":9,...}})");
//   // u->prompt_tokens, u->completion_tokens, u->cached_tokens (usage.prompt_tokens_details.cached_tokens)
//
// The last `"usage": {...}` object that parses is taken ("usage": null, as intermediate stream chunks carry
// it, is skipped). It is read with an event parser that keeps three numbers and builds no document: this
// runs once per response.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "router/router.h"

namespace kvroute::router {

std::optional<Usage> find_usage(std::string_view tail);

// usage_only_chunk: the usage of a stream chunk that carries nothing else, `{..., "choices": [], "usage": {...}}`:
// the extra chunk `stream_options.include_usage` adds at the end of a stream. nullopt for any other chunk
// (tokens, "usage": null, not JSON). Chunks without a usage object are turned away by a substring search,
// without parsing.
std::optional<Usage> usage_only_chunk(std::string_view chunk);

// ResponseStatusReader: the top-level "status" of a Responses API object (the body of GET /v1/responses/ID), read
// as the body streams through the relay, in constant memory whatever the size of its output. vLLM writes the
// status after the output and kvroute-sim before it, so neither the head nor the tail alone would do.
//
//   ResponseStatusReader r;
//   for (piece : body) r.feed(piece);
//   std::optional<std::string> s = r.finish();   // "completed"; nullopt if not a JSON object with a status
class ResponseStatusReader {
 public:
  ResponseStatusReader();
  ~ResponseStatusReader();
  ResponseStatusReader(const ResponseStatusReader&) = delete;
  ResponseStatusReader& operator=(const ResponseStatusReader&) = delete;

  void feed(std::string_view piece);
  std::optional<std::string> finish();

 private:
  struct Parser;
  std::unique_ptr<Parser> parser_;
};

// Whether a response's status is final: completed, failed, cancelled or incomplete.
bool final_response_status(std::string_view status);

}  // namespace kvroute::router
