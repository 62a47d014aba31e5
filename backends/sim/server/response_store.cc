#include "backends/sim/server/response_store.h"

#include <algorithm>

namespace kvroute::sim {

namespace {

// 64 bits of seed from the OS entropy source (random_device yields 32 bits per call).
std::uint64_t entropy_seed() {
  std::random_device rd;
  return (std::uint64_t{rd()} << 32) ^ rd();
}

void append_hex64(std::string& out, std::uint64_t v) {
  static constexpr char kHex[] = "0123456789abcdef";
  for (int shift = 60; shift >= 0; shift -= 4) out.push_back(kHex[(v >> shift) & 15]);
}

}  // namespace

ResponseStore::ResponseStore(std::size_t capacity) : capacity_(std::max<std::size_t>(capacity, 1)), rng_(entropy_seed()) {}

void ResponseStore::put(const std::string& id, StoredResponse r) {
  auto [it, inserted] = by_id_.insert_or_assign(id, std::move(r));
  if (!inserted) return;
  order_.push_back(id);
  while (order_.size() > capacity_) {
    by_id_.erase(order_.front());
    order_.pop_front();
  }
}

const StoredResponse* ResponseStore::find(std::string_view id) const {
  auto it = by_id_.find(std::string(id));
  return it == by_id_.end() ? nullptr : &it->second;
}

StoredResponse* ResponseStore::find(std::string_view id) {
  auto it = by_id_.find(std::string(id));
  return it == by_id_.end() ? nullptr : &it->second;
}

std::string ResponseStore::new_id(std::string_view prefix) {
  std::string out(prefix);
  out.reserve(prefix.size() + 32);
  append_hex64(out, rng_());
  append_hex64(out, rng_());
  return out;
}

}  // namespace kvroute::sim
