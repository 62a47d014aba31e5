#include "backends/shared_state/shared_state.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <random>

#include <hiredis/hiredis.h>

#include "backends/shared_state/redis_conn.h"
#include "backends/shared_state/wire.h"
#include "util/steady_seconds.h"

namespace kvroute::shared_state {
namespace {

using Clock = std::chrono::steady_clock;
std::string random_replica_id() {
  std::random_device rd;
  const std::uint64_t v = (std::uint64_t{rd()} << 32) ^ rd() ^ static_cast<std::uint64_t>(::getpid());
  return wire::hex64(v).substr(0, 12);
}

timeval to_timeval(std::chrono::milliseconds ms) {
  return timeval{static_cast<time_t>(ms.count() / 1000), static_cast<suseconds_t>((ms.count() % 1000) * 1000)};
}

}  // namespace

SharedState::SharedState(Options options, Handler& handler)
    : options_(std::move(options)),
      handler_(handler),
      replica_(random_replica_id()),
      wakeup_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}

SharedState::~SharedState() {
  stop();
  if (wakeup_ >= 0) ::close(wakeup_);
}

bool SharedState::start(std::chrono::milliseconds warm) {
  thread_ = std::thread([this] { run(); });
  const auto until = Clock::now() + warm;
  while (!warm_.load() && !told_down_attempted_.load() && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return warm_.load();
}

void SharedState::stop() {
  stopping_.store(true);
  if (thread_.joinable()) thread_.join();
}

void SharedState::enqueue(Command c) {
  bool was_empty = false;
  {
    std::lock_guard lock(mu_);
    const std::size_t blocks = c.routed ? c.routed->hashes.size() : 0;
    while (!queue_.empty() && (queue_.size() >= options_.queue_limit ||
                               queued_blocks_ + blocks > options_.queue_limit_blocks)) {
      if (auto& front = queue_.front().routed) {
        queued_blocks_ -= front->hashes.size();
        give_back_chain(std::move(front->hashes));
      }
      queue_.pop_front();
      dropped_.fetch_add(1, std::memory_order_relaxed);
    }
    was_empty = queue_.empty();
    queued_blocks_ += blocks;
    queue_.push_back(std::move(c));
  }
  // One wakeup per batch, and only while the thread waits: it takes the whole queue each time it wakes, and
  // before it waits it looks at the queue again (wait), so no record is left behind.
  if (was_empty && wakeup_ >= 0 && waiting_.load()) {
    const std::uint64_t one = 1;
    if (::write(wakeup_, &one, sizeof one) < 0) {}  // a full counter already wakes the thread
  }
}

void SharedState::routed(std::string_view worker, std::uint64_t root, std::span<const hashing::BlockHash> hashes,
                         std::uint64_t session, const policy::LoadShare& load, std::uint32_t computes_from) {
  // The request path only copies the hashes, into a chain the thread gave back: the thread encodes the record
  // (encode_routed) when it sends it.
  std::vector<hashing::BlockHash> chain;
  {
    std::lock_guard lock(mu_);
    if (!spare_chains_.empty()) {
      chain = std::move(spare_chains_.back());
      spare_chains_.pop_back();
    }
  }
  chain.assign(hashes.begin(), hashes.end());
  Command c;
  c.routed.emplace(Routed{std::string(worker), root, std::move(chain), session, load,
                          routed_seq_.fetch_add(1, std::memory_order_relaxed) + 1, computes_from,
                          steady_seconds(std::chrono::steady_clock::now())});
  enqueue(std::move(c));
}

void SharedState::give_back_chain(std::vector<hashing::BlockHash>&& chain) {
  // Bounded: at most 64 chains of at most 16,384 blocks (128 KB) each are kept: 8 MB.
  constexpr std::size_t kSpareChains = 64, kLargestKept = 16'384;
  if (spare_chains_.size() >= kSpareChains || chain.capacity() > kLargestKept || chain.capacity() == 0) return;
  chain.clear();
  spare_chains_.push_back(std::move(chain));
}

std::vector<std::string> SharedState::stream_record(std::string_view kind,
                                                    std::initializer_list<std::string> fields) const {
  std::vector<std::string> args{"XADD", key("stream"), "MAXLEN", "~", std::to_string(options_.stream_maxlen),
                                "*",    "r",           replica_, "k", std::string(kind)};
  args.insert(args.end(), fields);
  return args;
}

void SharedState::encode_routed(Command& c, std::vector<Command>& out) {
  const Routed& r = *c.routed;
  // Bounded: records that never come back (trimmed, Redis restarted) are forgotten oldest first.
  if (in_transit_.size() >= 10'000) in_transit_.pop_front();
  in_transit_.emplace_back(r.seq, r.at_s);
  Command x;
  x.args = stream_record("R", {"w", r.worker, "n", wire::hex64(r.root), "h"});
  x.args.push_back(wire::pack_hashes(r.hashes));  // moved in: a braced list would copy its 8 bytes per block
  x.args.insert(x.args.end(), {"q", std::to_string(r.seq), "l", wire::pack_share(r.load)});
  if (r.computes_from > 0) x.args.insert(x.args.end(), {"c", std::to_string(r.computes_from)});
  if (r.session == 0) {
    out.push_back(std::move(x));
    return;
  }
  x.args.insert(x.args.end(), {"s", wire::hex64(r.session)});
  out.push_back(std::move(x));
  Command s;
  s.args = {"SET", key("session:" + wire::hex64(r.session)), r.worker, "PX",
            std::to_string(static_cast<long long>(options_.session_ttl_s * 1000))};
  out.push_back(std::move(s));
}

void SharedState::response_owner(std::string_view id, std::string_view worker) {
  Command c;
  c.args = stream_record("O", {"i", std::string(id), "w", std::string(worker)});
  Command s;
  s.args = {"SET", key("response:" + std::string(id)), std::string(worker), "PX",
            std::to_string(static_cast<long long>(options_.response_ttl_s * 1000))};
  enqueue(std::move(c));
  enqueue(std::move(s));
}

void SharedState::prefix_computed(std::string_view worker, hashing::BlockHash last) {
  Command c;
  c.args = stream_record("F", {"w", std::string(worker), "b", wire::hex64(last)});
  enqueue(std::move(c));
}

void SharedState::admin(const AdminChange& change) {
  static constexpr const char* kOps[] = {"cordon", "uncordon", "add", "remove"};
  Command c;
  c.args = stream_record("A", {"op", kOps[static_cast<int>(change.kind)], "w", change.worker, "a", change.attrs});
  enqueue(std::move(c));
  // The state a restarted replica reads back.
  auto state = [&](std::vector<std::string> args) {
    Command s;
    s.args = std::move(args);
    enqueue(std::move(s));
  };
  switch (change.kind) {
    case AdminChange::Kind::kCordon: return state({"HSET", key("admin:cordoned"), change.worker, "1"});
    case AdminChange::Kind::kUncordon: return state({"HDEL", key("admin:cordoned"), change.worker});
    case AdminChange::Kind::kAdd:
      state({"HDEL", key("admin:removed"), change.worker});
      return state({"HSET", key("admin:added"), change.worker, change.attrs});
    case AdminChange::Kind::kRemove:
      state({"HDEL", key("admin:added"), change.worker});
      state({"HDEL", key("admin:cordoned"), change.worker});
      return state({"HSET", key("admin:removed"), change.worker, "1"});
  }
}

void SharedState::lookup_session(std::uint64_t session) { lookup(Command::Reply::kSession, "session:", wire::hex64(session)); }

void SharedState::lookup_response(std::string_view id) { lookup(Command::Reply::kResponse, "response:", std::string(id)); }

void SharedState::lookup(Command::Reply reply, std::string_view space, std::string what) {
  if (!up()) return;  // nothing to ask; the request goes on as a miss either way
  Command c;
  c.args = {"GET", key(std::string(space) + what)};
  c.key = std::move(what);
  c.reply = reply;
  enqueue(std::move(c));
}

SharedState::Status SharedState::status() const {
  Status s;
  s.up = up();
  s.published = published_.load();
  s.dropped = dropped_.load();
  s.applied = applied_.load();
  s.resyncs = resyncs_.load();
  s.reconnects = reconnects_.load();
  s.replicas = replicas_.load();
  s.replica = replica_;
  s.rank = rank_.load();
  s.stream_delay_s = stream_delay_s_.load();
  s.url = options_.url.display();
  s.prefix = options_.prefix;
  std::lock_guard lock(mu_);
  s.queued = queue_.size();
  s.last_error = last_error_;
  return s;
}

// ---- the thread ----

void SharedState::run() {
  auto backoff = std::chrono::milliseconds(100);
  auto next_load = Clock::now(), next_rates = Clock::now(), next_trim = Clock::now();
  while (!stopping_.load()) {
    if (!conn_) {
      if (!connect() || !resync()) {
        went_down(conn_ ? conn_->error() : last_error_copy());
        for (auto slept = std::chrono::milliseconds(0); slept < backoff && !stopping_.load(); slept += std::chrono::milliseconds(10)) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
        continue;
      }
      backoff = std::chrono::milliseconds(100);
      next_trim = Clock::now() + std::chrono::seconds(1);
    }
    const auto now = Clock::now();
    bool ok = flush();
    if (ok && now >= next_load) {
      ok = exchange_load();
      next_load = now + options_.load_interval;
    }
    if (ok && now >= next_rates) {
      ok = exchange_rates();
      next_rates = now + options_.rates_interval;
    }
    if (ok && now >= next_trim) {
      ok = check_trimmed();
      next_trim = now + std::chrono::seconds(1);
    }
    if (ok) ok = wait(std::max(Clock::duration::zero(), next_load - Clock::now()));
    if (!ok) went_down(conn_ ? conn_->error() : "connection lost");
  }
  conn_.reset();
  reader_.reset();
}

bool SharedState::wait(Clock::duration timeout) {
  // The reader connection has an XREAD BLOCK outstanding at all times: new records wake this thread at once,
  // and so does the queue (wakeup_), so a record published here is sent within a round trip, not after the
  // reader's block.
  if (!reading_) {
    reader_->append({"XREAD", "COUNT", "1000", "BLOCK", "100", "STREAMS", key("stream"), last_id_});
    int done = 0;
    while (!done) {
      if (redisBufferWrite(reader_->c, &done) != REDIS_OK) return false;
    }
    reading_ = true;
  }
  pollfd fds[2] = {{reader_->c->fd, POLLIN, 0}, {wakeup_, POLLIN, 0}};
  int ms = std::min(static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count()) + 1, 100);
  // Announce the wait, then look at the queue: a record queued before this look is seen here (the wait does not
  // block), one queued after it sees waiting_ and writes the wakeup.
  waiting_.store(true);
  {
    std::lock_guard lock(mu_);
    if (!queue_.empty()) ms = 0;
  }
  const int polled = ::poll(fds, 2, ms);
  waiting_.store(false);
  if (polled < 0) return errno == EINTR;
  if (fds[1].revents & POLLIN) {
    std::uint64_t n = 0;
    if (::read(wakeup_, &n, sizeof n) < 0) {}  // only clears the counter
  }
  if (!(fds[0].revents & (POLLIN | POLLHUP | POLLERR))) return true;
  reading_ = false;
  ReplyPtr r = reader_->reply();
  if (!r) return false;
  apply_entries(r.get());
  if (peers_changed_) give_remote_load();
  return true;
}

std::string SharedState::last_error_copy() const {
  std::lock_guard lock(mu_);
  return last_error_;
}

std::unique_ptr<SharedState::Conn> SharedState::open() {
  auto conn = std::make_unique<Conn>();
  const auto& u = options_.url;
  conn->c = redisConnectWithTimeout(u.host.c_str(), u.port, to_timeval(options_.io_timeout));
  if (!conn->c || conn->c->err) {
    set_error("cannot connect to " + u.display() + ": " + conn->error());
    return nullptr;
  }
  redisSetTimeout(conn->c, to_timeval(options_.io_timeout));
  auto check = [&](ReplyPtr r, const char* what) {
    if (!r) return set_error(std::string(what) + ": " + conn->error()), false;
    if (r->type == REDIS_REPLY_ERROR) return set_error(std::string(what) + ": " + std::string(r->str, r->len)), false;
    return true;
  };
  if (!u.password.empty()) {
    std::vector<std::string> auth{"AUTH"};
    if (!u.user.empty()) auth.push_back(u.user);
    auth.push_back(u.password);
    if (!check(conn->command(auth), "AUTH")) return nullptr;
  }
  if (u.db != 0 && !check(conn->command({"SELECT", std::to_string(u.db)}), "SELECT")) return nullptr;
  return conn;
}

bool SharedState::connect() {
  conn_ = open();
  reader_ = conn_ ? open() : nullptr;
  reading_ = false;
  if (!reader_) conn_.reset();
  return conn_ != nullptr;
}

void SharedState::set_error(std::string e) {
  std::lock_guard lock(mu_);
  last_error_ = std::move(e);
}

bool SharedState::resync() {
  // What this replica queued while Redis was away goes first, so that the state read back includes it.
  if (!flush()) return false;
  if (!check_trimmed()) return false;
  // Catch up: the records since the last position (all of the stream for a new replica).
  for (int guard = 0; guard < 10'000 && !stopping_.load(); ++guard) {
    std::size_t got = 0;
    if (!catch_up(&got)) return false;
    if (got == 0) break;
  }
  AdminState admin;
  // P:admin:epoch marks a Redis that holds the deployment's admin state; without it (a Redis that restarted
  // empty, or a new deployment) the replicas write theirs back instead of taking an empty one, and the marker
  // is queued after what they write.
  auto epoch = conn_->command({"EXISTS", key("admin:epoch")});
  if (!epoch) return false;
  admin.fresh = epoch->type == REDIS_REPLY_INTEGER && epoch->integer == 0;
  auto cordoned = conn_->command({"HKEYS", key("admin:cordoned")});
  auto added = conn_->command({"HGETALL", key("admin:added")});
  auto removed = conn_->command({"HKEYS", key("admin:removed")});
  if (!cordoned || !added || !removed) return false;
  for (std::size_t i = 0; cordoned->type == REDIS_REPLY_ARRAY && i < cordoned->elements; ++i) {
    admin.cordoned.emplace_back(str(cordoned->element[i]));
  }
  for (std::size_t i = 0; added->type == REDIS_REPLY_ARRAY && i + 1 < added->elements; i += 2) {
    admin.added[std::string(str(added->element[i]))] = std::string(str(added->element[i + 1]));
  }
  for (std::size_t i = 0; removed->type == REDIS_REPLY_ARRAY && i < removed->elements; ++i) {
    admin.removed.emplace_back(str(removed->element[i]));
  }
  handler_.apply_admin_state(admin);
  if (admin.fresh) {
    Command mark;
    mark.args = {"SET", key("admin:epoch"), "1"};
    enqueue(std::move(mark));
  }
  if (!exchange_rates() || !exchange_load()) return false;
  resyncs_.fetch_add(1, std::memory_order_relaxed);
  up_.store(true);
  warm_.store(true);
  if (!was_up_) handler_.up_changed(true, "");
  was_up_ = true;
  told_down_ = false;
  return true;
}

void SharedState::went_down(const std::string& why) {
  if (conn_) {
    set_error(why);
    conn_.reset();
  }
  reader_.reset();
  reading_ = false;
  up_.store(false);
  if (was_up_ || !told_down_) {
    peers_.clear();
    handler_.apply_remote_load({});  // the others' load is not known any more
    handler_.up_changed(false, why);
    if (was_up_) reconnects_.fetch_add(1, std::memory_order_relaxed);
  }
  was_up_ = false;
  told_down_ = true;
  told_down_attempted_.store(true);
}

bool SharedState::flush() {
  std::deque<Command> batch;
  {
    std::lock_guard lock(mu_);
    batch.swap(queue_);
    queued_blocks_ = 0;
  }
  if (batch.empty()) return true;
  std::vector<Command> cmds;
  cmds.reserve(batch.size());
  for (auto& c : batch) {
    if (c.routed) encode_routed(c, cmds);
    else cmds.push_back(std::move(c));
  }
  {
    std::lock_guard lock(mu_);
    for (auto& c : batch) {
      if (c.routed) give_back_chain(std::move(c.routed->hashes));
    }
  }
  for (const auto& c : cmds) conn_->append(c.args);
  for (std::size_t i = 0; i < cmds.size(); ++i) {
    ReplyPtr r = conn_->reply();
    if (!r) {
      dropped_.fetch_add(cmds.size() - i, std::memory_order_relaxed);
      return false;
    }
    published_.fetch_add(1, std::memory_order_relaxed);
    const Command& c = cmds[i];
    if (r->type == REDIS_REPLY_ERROR) {
      set_error(std::string(c.args.front()) + ": " + std::string(r->str, r->len));
    } else if (c.reply == Command::Reply::kSession && r->type == REDIS_REPLY_STRING) {
      if (auto h = wire::parse_hex64(c.key)) handler_.apply_session(*h, std::string(str(r.get())));
    } else if (c.reply == Command::Reply::kResponse && r->type == REDIS_REPLY_STRING) {
      handler_.apply_response_owner(c.key, std::string(str(r.get())));
    }
  }
  return true;
}

bool SharedState::check_trimmed() {
  if (last_id_ == "0-0") return true;  // reading from the start: nothing can be missed
  ReplyPtr info = conn_->command({"XINFO", "STREAM", key("stream")});
  if (!info) return false;
  if (info->type != REDIS_REPLY_ARRAY) {
    // No stream (Redis restarted empty, or FLUSHALL): read whatever comes from the start.
    last_id_ = "0-0";
    return true;
  }
  std::string_view max_deleted, last_generated;
  for (std::size_t i = 0; i + 1 < info->elements; i += 2) {
    const auto name = str(info->element[i]);
    if (name == "max-deleted-entry-id") max_deleted = str(info->element[i + 1]);
    if (name == "last-generated-id") last_generated = str(info->element[i + 1]);
  }
  // Records past our position were trimmed before we read them (we fell behind), or the stream is younger
  // than our position (Redis lost it): read what is there from the start.
  if ((!max_deleted.empty() && wire::compare_ids(max_deleted, last_id_) > 0) ||
      (!last_generated.empty() && wire::compare_ids(last_generated, last_id_) < 0)) {
    last_id_ = "0-0";
    resyncs_.fetch_add(1, std::memory_order_relaxed);
  }
  return true;
}

bool SharedState::catch_up(std::size_t* got) {
  ReplyPtr r = conn_->command({"XREAD", "COUNT", "5000", "STREAMS", key("stream"), last_id_});
  if (!r) return false;
  *got = apply_entries(r.get());
  return true;
}

std::size_t SharedState::apply_entries(const redisReply* r) {
  // XREAD's reply: nil (nothing new), or [[stream, [[id, [field, value, ...]], ...]]].
  if (r->type != REDIS_REPLY_ARRAY || r->elements == 0) return 0;
  const redisReply* entries = r->element[0]->elements == 2 ? r->element[0]->element[1] : nullptr;
  if (!entries || entries->type != REDIS_REPLY_ARRAY) return 0;
  std::vector<std::pair<std::string_view, std::string_view>> fields;
  for (std::size_t i = 0; i < entries->elements; ++i) {
    const redisReply* e = entries->element[i];
    if (e->type != REDIS_REPLY_ARRAY || e->elements != 2) continue;
    const auto id = str(e->element[0]);
    if (wire::compare_ids(id, last_id_) <= 0) continue;  // read twice (the reader's and a catch-up's)
    last_id_ = std::string(id);
    const redisReply* kv = e->element[1];
    fields.clear();
    for (std::size_t j = 0; kv->type == REDIS_REPLY_ARRAY && j + 1 < kv->elements; j += 2) {
      fields.emplace_back(str(kv->element[j]), str(kv->element[j + 1]));
    }
    apply_record(fields);
  }
  return entries->elements;
}

void SharedState::apply_record(std::span<const std::pair<std::string_view, std::string_view>> fields) {
  auto field = [&](std::string_view name) {
    for (const auto& [k, v] : fields) {
      if (k == name) return v;
    }
    return std::string_view();
  };
  if (field("r") == replica_) {  // our own: only how long it took
    if (field("k") == "R") read_back(wire::parse_count(field("q")).value_or(0));
    return;
  }
  const auto kind = field("k");
  const std::string worker(field("w"));
  if (worker.empty()) return;
  if (kind == "R") {
    Routed r;
    r.worker = worker;
    r.root = wire::parse_hex64(field("n")).value_or(0);
    r.hashes = wire::unpack_hashes(field("h"));
    r.session = wire::parse_hex64(field("s")).value_or(0);
    r.seq = wire::parse_count(field("q")).value_or(0);
    r.computes_from = static_cast<std::uint32_t>(std::min<std::uint64_t>(wire::parse_count(field("c")).value_or(0), r.hashes.size()));
    if (auto l = wire::unpack_share(field("l")); l && r.seq > 0) {
      Peer& p = peers_[std::string(field("r"))];
      // Bounded: a sender whose published load never comes (it stopped) is forgotten at the next exchange.
      if (r.seq > p.covered && p.since.size() < 100'000) {
        p.seen = Clock::now();
        p.since.emplace_back(r.seq, WorkerLoad::of(worker, *l, steady_seconds(p.seen)));
        peers_changed_ = true;
      }
    }
    handler_.apply_routed(r);
    if (r.session != 0) handler_.apply_session(r.session, worker);
  } else if (kind == "O") {
    handler_.apply_response_owner(std::string(field("i")), worker);
  } else if (kind == "F") {
    const auto last = wire::parse_hex64(field("b"));
    if (!last) return;
    handler_.apply_prefix_computed(worker, *last);
  } else if (kind == "A") {
    const auto op = field("op");
    AdminChange c;
    c.worker = worker;
    c.attrs = std::string(field("a"));
    if (op == "cordon") c.kind = AdminChange::Kind::kCordon;
    else if (op == "uncordon") c.kind = AdminChange::Kind::kUncordon;
    else if (op == "add") c.kind = AdminChange::Kind::kAdd;
    else if (op == "remove") c.kind = AdminChange::Kind::kRemove;
    else return;
    handler_.apply_admin(c);
  } else {
    return;
  }
  applied_.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace kvroute::shared_state
