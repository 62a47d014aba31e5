#include "hashing/computing_prefixes.h"

#include <algorithm>
#include <limits>

namespace kvroute::hashing {

ComputingPrefixes::Token ComputingPrefixes::begin(WorkerId worker, std::span<const BlockHash> chain,
                                                  std::size_t from, double now, double starts_at) {
  if (from >= chain.size()) return 0;
  std::lock_guard lock(mu_);
  if (worker >= workers_.size()) workers_.resize(static_cast<std::size_t>(worker) + 1);
  const Token t = next_++;
  workers_[worker].entries.push_back(Entry{t, from,
                                           std::vector<BlockHash>(chain.begin() + static_cast<std::ptrdiff_t>(from), chain.end()),
                                           now, std::max(starts_at, now)});
  return t;
}

ComputingPrefixes::Token ComputingPrefixes::begin_elsewhere(WorkerId worker, std::span<const BlockHash> chain,
                                                            std::size_t from, double now) {
  if (from >= chain.size()) return 0;
  std::lock_guard lock(mu_);
  if (worker >= workers_.size()) workers_.resize(static_cast<std::size_t>(worker) + 1);
  auto& list = workers_[worker].entries;
  // Others' entries whose store event never came (the request failed there, or the event was lost).
  std::erase_if(list, [&](const Entry& e) { return e.elsewhere && now - e.began_at > kElsewhereTtl; });
  const Token t = next_++;
  Entry e{t, from, std::vector<BlockHash>(chain.begin() + static_cast<std::ptrdiff_t>(from), chain.end()), now,
          std::numeric_limits<double>::infinity()};
  e.elsewhere = true;
  list.push_back(std::move(e));
  return t;
}

std::optional<ComputingPrefixes::Entry> ComputingPrefixes::take(WorkerId worker, Token token) {
  if (token == 0 || worker >= workers_.size()) return std::nullopt;
  auto& list = workers_[worker].entries;
  auto it = std::find_if(list.begin(), list.end(), [&](const Entry& e) { return e.token == token; });
  if (it == list.end()) return std::nullopt;
  Entry e = std::move(*it);
  list.erase(it);
  return e;
}

void ComputingPrefixes::end(WorkerId worker, Token token) {
  std::lock_guard lock(mu_);
  take(worker, token);
}

void ComputingPrefixes::stored(WorkerId worker, std::span<const BlockHash> blocks, double now) {
  std::lock_guard lock(mu_);
  if (worker >= workers_.size()) return;
  auto& list = workers_[worker].entries;
  for (Entry& e : list) {
    if (e.stored_at < 0 && std::find(blocks.begin(), blocks.end(), e.blocks.back()) != blocks.end()) e.stored_at = now;
  }
  // Another replica's request has computed its blocks: nothing of it is computing any more.
  std::erase_if(list, [](const Entry& e) { return e.elsewhere && e.stored_at >= 0; });
}

std::optional<BlockHash> ComputingPrefixes::first_token(WorkerId worker, Token token, double now) {
  std::lock_guard lock(mu_);
  const auto e = take(worker, token);
  if (!e) return std::nullopt;
  std::optional<BlockHash> unstored;
  if (e->stored_at < 0 || e->stored_at > now) unstored = e->blocks.back();  // later: a simulation's event in flight
  if (e->blocks.size() < kTeachMinBlocks || e->blocks.size() > kTeachMaxBlocks) return unstored;
  const double margin = 0.25 * (now - e->began_at);
  const bool at_schedule = e->stored_at >= 0 && now - e->stored_at >= margin;
  int& score = workers_[worker].commits_at_schedule;
  score = std::clamp(score + (at_schedule ? 1 : -1), -3, 3);
  return unstored;
}

std::vector<ComputingPrefixes::Token> ComputingPrefixes::computed_elsewhere(WorkerId worker, BlockHash last) {
  std::vector<Token> done;
  std::lock_guard lock(mu_);
  if (worker >= workers_.size()) return done;
  std::erase_if(workers_[worker].entries, [&](const Entry& e) {
    if (!e.elsewhere || e.blocks.back() != last) return false;
    done.push_back(e.token);
    return true;
  });
  return done;
}

ComputingPrefixes::Commit ComputingPrefixes::commit(WorkerId worker) const {
  std::lock_guard lock(mu_);
  const int score = worker < workers_.size() ? workers_[worker].commits_at_schedule : 0;
  return score > 0 ? Commit::kAtSchedule : score < 0 ? Commit::kAfterStep : Commit::kUnknown;
}

std::optional<ComputingPrefixes::Computation> ComputingPrefixes::leader(WorkerId worker, std::size_t pos,
                                                                     BlockHash block) const {
  std::lock_guard lock(mu_);
  if (worker >= workers_.size()) return std::nullopt;
  for (const Entry& e : workers_[worker].entries) {
    if (pos >= e.from && pos - e.from < e.blocks.size() && e.blocks[pos - e.from] == block)
      return Computation{e.token, e.from, e.starts_at};
  }
  return std::nullopt;
}

bool ComputingPrefixes::active(WorkerId worker, Token token) const {
  std::lock_guard lock(mu_);
  if (worker >= workers_.size()) return false;
  const auto& list = workers_[worker].entries;
  return std::any_of(list.begin(), list.end(), [&](const Entry& e) { return e.token == token; });
}

void ComputingPrefixes::forget(WorkerId worker) {
  std::lock_guard lock(mu_);
  if (worker < workers_.size()) workers_[worker] = Worker{};
}

std::size_t ComputingPrefixes::size(WorkerId worker) const {
  std::lock_guard lock(mu_);
  return worker < workers_.size() ? workers_[worker].entries.size() : 0;
}

}  // namespace kvroute::hashing
