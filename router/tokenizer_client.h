// Tokenization through the workers' own /tokenize endpoint (vLLM's request and response shape), so that
// text requests are hashed over the same token ids the engines cache and publish in their KV events.
//
// A bounded LRU cache keyed by the /tokenize body's hash answers repeated prompts without a round trip; a
// worker that does not answer within the timeout leaves the request on its text chain (docs/hashing.md).
//
//   TokenizeCache cache(4096);
//   if (auto tokens = cache.get(key)) use(*tokens);
//   auto tokens = parse_tokenize_response(body);   // Result<std::vector<uint32_t>>
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "util/result.h"

namespace kvroute::router {

using TokenIds = std::shared_ptr<const std::vector<std::uint32_t>>;

class TokenizeCache {
 public:
  explicit TokenizeCache(std::size_t capacity) : capacity_(capacity) {}
  TokenIds get(std::uint64_t key);
  void put(std::uint64_t key, TokenIds tokens);
  std::size_t size() const;

 private:
  std::size_t capacity_;
  mutable std::mutex mu_;
  std::list<std::pair<std::uint64_t, TokenIds>> lru_;  // most recent first; guarded by mu_
  std::unordered_map<std::uint64_t, std::list<std::pair<std::uint64_t, TokenIds>>::iterator> map_;  // guarded by mu_
};

// {"count": N, "max_model_len": M, "tokens": [...]} to the token ids; at most `max_tokens` of them.
Result<std::vector<std::uint32_t>> parse_tokenize_response(std::string_view body, std::size_t max_tokens = 4 << 20);

}  // namespace kvroute::router
