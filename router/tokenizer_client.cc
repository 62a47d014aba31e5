#include "router/tokenizer_client.h"

#include <boost/json.hpp>

namespace kvroute::router {

TokenIds TokenizeCache::get(std::uint64_t key) {
  std::lock_guard lock(mu_);
  auto it = map_.find(key);
  if (it == map_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->second;
}

void TokenizeCache::put(std::uint64_t key, TokenIds tokens) {
  if (capacity_ == 0) return;
  std::lock_guard lock(mu_);
  if (auto it = map_.find(key); it != map_.end()) {
    it->second->second = std::move(tokens);
    lru_.splice(lru_.begin(), lru_, it->second);
    return;
  }
  lru_.emplace_front(key, std::move(tokens));
  map_[key] = lru_.begin();
  while (lru_.size() > capacity_) {
    map_.erase(lru_.back().first);
    lru_.pop_back();
  }
}

std::size_t TokenizeCache::size() const {
  std::lock_guard lock(mu_);
  return lru_.size();
}

Result<std::vector<std::uint32_t>> parse_tokenize_response(std::string_view body, std::size_t max_tokens) {
  boost::system::error_code ec;
  auto v = boost::json::parse(body, ec);
  if (ec || !v.is_object()) return make_error("/tokenize answered with something that is not a JSON object");
  const auto* tokens = v.as_object().if_contains("tokens");
  if (!tokens || !tokens->is_array()) return make_error("/tokenize answer has no 'tokens' array");
  const auto& arr = tokens->as_array();
  if (arr.size() > max_tokens) return make_error("/tokenize answered with more than " + std::to_string(max_tokens) + " tokens");
  std::vector<std::uint32_t> out;
  out.reserve(arr.size());
  for (const auto& t : arr) {
    if (t.is_int64() && t.as_int64() >= 0 && t.as_int64() <= 0xffffffffll) {
      out.push_back(static_cast<std::uint32_t>(t.as_int64()));
    } else if (t.is_uint64() && t.as_uint64() <= 0xffffffffull) {
      out.push_back(static_cast<std::uint32_t>(t.as_uint64()));
    } else {
      return make_error("/tokenize answered with a token id that is not a 32-bit unsigned integer");
    }
  }
  return out;
}

}  // namespace kvroute::router
