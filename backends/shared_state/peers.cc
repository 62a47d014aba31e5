// SharedState, what the replicas say about themselves (the shared state's thread): each one's load per worker
// (P:load:REPLICA, P:replicas), the replicas running (P:members) and this one's rank among them, learned rates
// (P:rates), and how long this replica's routed records take to come back on the stream.
#include <algorithm>
#include <chrono>
#include <cmath>

#include "backends/shared_state/redis_conn.h"
#include "backends/shared_state/shared_state.h"
#include "backends/shared_state/wire.h"
#include "util/steady_seconds.h"

namespace kvroute::shared_state {

bool SharedState::exchange_load() {
  // The count first: every record it covers was routed (and its load counted here) before local_load() reads.
  const std::uint64_t seq = routed_seq_.load(std::memory_order_relaxed);
  const std::string mine = wire::pack_load(handler_.local_load());
  const std::string load_key = key("load:" + replica_);
  // An idle replica deletes its key once instead of writing zeros every interval; it writes its count alone when
  // it routed since its last load (the others then drop those records' load).
  int writes = 0;
  if (!mine.empty() || seq != published_seq_) {
    conn_->append({"SET", load_key, wire::pack_load_seq(seq) + mine, "PX", std::to_string(options_.load_ttl.count())});
    conn_->append({"SADD", key("replicas"), replica_});
    writes = 2;
  } else if (load_published_) {
    conn_->append({"DEL", load_key});
    writes = 1;
  }
  load_published_ = !mine.empty() || seq != published_seq_;
  published_seq_ = seq;
  conn_->append({"SMEMBERS", key("replicas")});
  for (int i = 0; i < writes; ++i) {
    if (!conn_->reply()) return false;
  }
  ReplyPtr members = conn_->reply();
  if (!members) return false;
  std::vector<std::string> others;
  for (std::size_t i = 0; members->type == REDIS_REPLY_ARRAY && i < members->elements; ++i) {
    if (str(members->element[i]) != replica_) others.emplace_back(str(members->element[i]));
  }
  std::size_t live = 0;
  const auto now = std::chrono::steady_clock::now();
  for (auto& [id, p] : peers_) p.load.clear();
  if (!others.empty()) {
    std::vector<std::string> mget{"MGET"};
    for (const auto& o : others) mget.push_back(key("load:" + o));
    ReplyPtr values = conn_->command(mget);
    if (!values) return false;
    std::vector<std::string> gone{"SREM", key("replicas")};
    for (std::size_t i = 0; values->type == REDIS_REPLY_ARRAY && i < values->elements && i < others.size(); ++i) {
      if (values->element[i]->type == REDIS_REPLY_STRING) {
        const std::string_view text = str(values->element[i]);
        Peer& p = peers_[others[i]];
        p.covered = std::max(p.covered, wire::load_seq(text));
        wire::add_load(text, p.load);
        for (auto& l : p.load) l.at = steady_seconds(now);
        std::erase_if(p.since, [&](const auto& d) { return d.first <= p.covered; });
        p.seen = now;
        ++live;
      } else {
        gone.push_back(others[i]);  // expired: that replica stopped or is idle; it adds itself back when busy
      }
    }
    if (gone.size() > 2 && !conn_->command(gone)) return false;
  }
  // A replica whose load expired, and records of one whose load never came within the load's lifetime.
  std::erase_if(peers_, [&](const auto& e) { return now - e.second.seen > options_.load_ttl; });
  replicas_.store(live, std::memory_order_relaxed);
  give_remote_load();
  return exchange_ends() && refresh_members();
}

bool SharedState::exchange_ends() {
  const std::string hash = key("ended");
  std::map<std::string_view, std::uint64_t> added;  // this exchange's increments, by worker
  const auto mine = handler_.local_ended();
  int writes = 0;
  for (const auto& [worker, n] : mine) {
    Ends& e = ends_[worker];
    const std::uint64_t d = n > e.sent ? n - e.sent : 0;  // less: the worker was removed and added again here
    e.sent = n;
    if (d == 0) continue;
    added[worker] = d;
    conn_->append({"HINCRBY", hash, worker, std::to_string(d)});
    ++writes;
  }
  // Kept while any replica serves; workers long gone leave with it.
  if (writes > 0) {
    conn_->append({"PEXPIRE", hash, "3600000"});
    ++writes;
  }
  conn_->append({"HGETALL", hash});
  for (int i = 0; i < writes; ++i) {
    if (!conn_->reply()) return false;
  }
  ReplyPtr all = conn_->reply();
  if (!all) return false;
  std::vector<std::pair<std::string, std::uint64_t>> others;
  for (std::size_t i = 0; all->type == REDIS_REPLY_ARRAY && i + 1 < all->elements; i += 2) {
    const std::string_view worker = str(all->element[i]);
    const auto total = wire::parse_count(str(all->element[i + 1]));
    if (!total) continue;
    Ends& e = ends_[std::string(worker)];
    const auto it = added.find(worker);
    const std::uint64_t own = it == added.end() ? 0 : it->second;
    // A worker new to the hash since the last read started from 0; at the first read, every count is a start.
    std::optional<std::uint64_t> before = e.seen;
    if (!before && ends_read_) before = 0;
    if (before && *total >= *before + own) e.others += *total - *before - own;
    e.seen = *total;
    others.emplace_back(worker, e.others);
  }
  ends_read_ = true;
  handler_.apply_others_ended(others);
  return true;
}

bool SharedState::refresh_members() {
  const auto now = std::chrono::steady_clock::now();
  if (now - members_at_ < std::chrono::seconds(1)) return true;
  members_at_ = now;
  // Scores are wall-clock milliseconds (the replicas' clocks agree to well within the 5 s a member is kept).
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::system_clock::now().time_since_epoch()).count();
  conn_->append({"ZADD", key("members"), std::to_string(ms), replica_});
  conn_->append({"ZREMRANGEBYSCORE", key("members"), "-inf", std::to_string(ms - 5000)});
  conn_->append({"ZRANGE", key("members"), "0", "-1"});
  if (!conn_->reply() || !conn_->reply()) return false;
  ReplyPtr members = conn_->reply();
  if (!members) return false;
  std::size_t count = 1, before = 0;
  for (std::size_t i = 0; members->type == REDIS_REPLY_ARRAY && i < members->elements; ++i) {
    const std::string_view id = str(members->element[i]);
    if (id == replica_) continue;
    ++count;
    if (id < replica_) ++before;
  }
  members_.store(count, std::memory_order_relaxed);
  rank_.store(before, std::memory_order_relaxed);
  return true;
}

void SharedState::give_remote_load() {
  std::vector<WorkerLoad> parts;
  for (const auto& [id, p] : peers_) {
    parts.insert(parts.end(), p.load.begin(), p.load.end());
    for (const auto& [seq, l] : p.since) parts.push_back(l);
  }
  peers_changed_ = false;
  handler_.apply_remote_load(wire::queued_at(parts, steady_seconds(std::chrono::steady_clock::now())));
}

bool SharedState::exchange_rates() {
  std::vector<std::string> hset{"HSET", key("rates")};
  for (const auto& [worker, rates] : handler_.local_rates()) {
    if (rates.prefill_samples == 0 && rates.decode_samples == 0) continue;
    hset.push_back(worker);
    hset.push_back(wire::pack_rates(rates));
  }
  if (hset.size() > 2 && !conn_->command(hset)) return false;
  ReplyPtr all = conn_->command({"HGETALL", key("rates")});
  if (!all) return false;
  for (std::size_t i = 0; all->type == REDIS_REPLY_ARRAY && i + 1 < all->elements; i += 2) {
    if (auto r = wire::unpack_rates(str(all->element[i + 1]))) handler_.apply_rates(std::string(str(all->element[i])), *r);
  }
  return true;
}

void SharedState::read_back(std::uint64_t seq) {
  while (!in_transit_.empty() && in_transit_.front().first < seq) in_transit_.pop_front();
  if (in_transit_.empty() || in_transit_.front().first != seq) return;
  const double lag = steady_seconds(std::chrono::steady_clock::now()) - in_transit_.front().second;
  in_transit_.pop_front();
  // The time by which a record is back, as TCP bounds the time an acknowledgement takes (RFC 6298, section 2):
  // a smoothed mean (gain 1/8) plus 4 x a smoothed mean deviation (gain 1/4). A replica taking its turn waits
  // this long per rank, so that the earlier ranks' records have nearly always reached it.
  if (srtt_ <= 0) {
    srtt_ = lag;
    rttvar_ = lag / 2;
  } else {
    rttvar_ += (std::abs(srtt_ - lag) - rttvar_) / 4.0;
    srtt_ += (lag - srtt_) / 8.0;
  }
  stream_delay_s_.store(srtt_ + 4.0 * rttvar_, std::memory_order_relaxed);
}

SharedState::Turn SharedState::turn() const {
  const std::size_t members = members_.load(std::memory_order_relaxed);
  return Turn{std::min(rank_.load(std::memory_order_relaxed), members - 1), members,
              stream_delay_s_.load(std::memory_order_relaxed)};
}

}  // namespace kvroute::shared_state
