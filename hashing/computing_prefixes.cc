#include "hashing/computing_prefixes.h"

#include <algorithm>

namespace kvroute::hashing {

ComputingPrefixes::Token ComputingPrefixes::begin(WorkerId worker, std::span<const BlockHash> chain,
                                                  std::size_t from) {
  if (from >= chain.size()) return 0;
  std::lock_guard lock(mu_);
  if (worker >= workers_.size()) workers_.resize(static_cast<std::size_t>(worker) + 1);
  const Token t = next_++;
  workers_[worker].push_back(Entry{t, from, std::vector<BlockHash>(chain.begin() + static_cast<std::ptrdiff_t>(from), chain.end())});
  return t;
}

void ComputingPrefixes::end(WorkerId worker, Token token) {
  if (token == 0) return;
  std::lock_guard lock(mu_);
  if (worker >= workers_.size()) return;
  auto& list = workers_[worker];
  // Kept in registration order (computing() answers the earliest), so erase rather than swap with the last.
  auto it = std::find_if(list.begin(), list.end(), [&](const Entry& e) { return e.token == token; });
  if (it != list.end()) list.erase(it);
}

std::optional<ComputingPrefixes::Token> ComputingPrefixes::computing(WorkerId worker, std::size_t pos,
                                                                     BlockHash block) const {
  std::lock_guard lock(mu_);
  if (worker >= workers_.size()) return std::nullopt;
  for (const Entry& e : workers_[worker]) {
    if (pos >= e.from && pos - e.from < e.blocks.size() && e.blocks[pos - e.from] == block) return e.token;
  }
  return std::nullopt;
}

bool ComputingPrefixes::active(WorkerId worker, Token token) const {
  std::lock_guard lock(mu_);
  if (worker >= workers_.size()) return false;
  const auto& list = workers_[worker];
  return std::any_of(list.begin(), list.end(), [&](const Entry& e) { return e.token == token; });
}

std::size_t ComputingPrefixes::size(WorkerId worker) const {
  std::lock_guard lock(mu_);
  return worker < workers_.size() ? workers_[worker].size() : 0;
}

}  // namespace kvroute::hashing
