// SharedState: what router replicas tell one another through Redis (architecture section 11), so that several
// kvroute replicas behind one Service act as one router.
//
// What goes through Redis (keys under --shared-state-prefix P; docs/operations.md, "Router replicas"):
//  * P:stream, a Redis Stream (XADD ... MAXLEN ~ N): what each replica routed in approximate mode (the worker's
//    URL, the namespace root and the chain's block hashes, never prompt text; with the hash of the session key
//    it bound), the owners of Responses API ids, the first tokens of requests whose computed prefix no KV
//    event has stored yet (precise mode), and admin changes. Every replica applies the others' records.
//  * P:load:REPLICA (SET ... PX) and the set P:replicas: each replica's in-flight requests, pending prefill,
//    decode context and time without a first token per worker, every --shared-state-interval, expiring when the
//    replica stops publishing.
//  * P:session:HASH and P:response:ID (SET ... PX): session bindings and response owners with their TTLs, for a
//    replica that missed the stream record (it asks on a miss, without waiting).
//  * P:admin:cordoned, P:admin:added, P:admin:removed (hashes by worker URL): the operator's changes, which a
//    replica applies when it starts, so they survive restarts (P:admin:epoch marks that Redis holds them).
//    P:rates: learned worker rates.
//  * P:members (a sorted set, scored by the wall-clock time of each replica's last heartbeat, every second):
//    the running replicas, busy or idle, for each one's rank when they take turns in bursts (turn()).
//
// Threading. One dedicated thread owns two synchronous hiredis connections; the request path only appends to
// a bounded queue under a short lock (drop-oldest, counted; the first record of a batch also writes an eventfd)
// and never waits for Redis. The thread keeps an XREAD BLOCK outstanding on one connection and poll()s it with
// the eventfd: new records of the others are applied as they come, and the queue is sent as one pipeline on
// the other connection as soon as something is in it (a record reaches the other replicas within a few round
// trips, well under a millisecond on a LAN).
// A thread of its own rather than hiredis's async API on the Asio loops: the daemon's I/O threads are share-
// nothing (router/app.h), so an async connection would live on one of them and every other thread would post
// to it anyway; a blocking XREAD needs no timer plumbing; and a slow or unreachable Redis (socket timeouts,
// reconnect backoff) stalls only this thread, never a request's. Records arrive through Handler callbacks on
// that thread.
//
// Redis down: the replica goes on alone (up() false, one log line through the handler), reconnects with
// backoff (0.1 s doubling to 1 s) and then resynchronizes: it reads the recent stream and the admin state
// again. A replica whose stream position was trimmed away (it fell behind) resynchronizes the same way.
//
//   SharedState::Options o;  o.url = *parse_redis_url("redis://:secret@10.0.0.5:6379/0");
//   SharedState state(o, handler);
//   state.start(std::chrono::seconds(3));                 // warm start: reads the recent stream first
//   state.routed("http://10.0.0.7:8000", chain.root, chain.hashes, session_hash);   // never blocks
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "hashing/block_chain.h"
#include "policy/rate_learner.h"
#include "util/result.h"

struct redisReply;  // hiredis

namespace kvroute::shared_state {

struct RedisUrl {
  std::string host;
  int port = 6379;
  std::string user;      // Redis 6 ACL user; empty: the default user
  std::string password;  // empty: no AUTH
  int db = 0;
  std::string display() const;  // redis://HOST:PORT/DB, without the password
};
// redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]; errors say what is wrong.
Result<RedisUrl> parse_redis_url(std::string_view url);

// One replica's load on one worker (or the sum over the other replicas).
struct WorkerLoad {
  std::string worker;  // the worker's URL, the same on every replica
  std::uint32_t in_flight = 0;
  std::uint64_t pending_prefill_tokens = 0;
  double pending_prefill_s = 0;
  double oldest_prefill_s = 0;
  std::uint64_t active_decode_tokens = 0;
  // When this replica learned it (read the load, received the record), in seconds on its steady clock
  // (steady_seconds); for the sum handed to the router, the time its pending prefill is as of (policy::queued_at).
  double at = 0;
  double prefill_elapsed_s = 0;  // policy::LoadShare::prefill_elapsed_s
  std::uint64_t inflight_kv_tokens = 0;  // policy::LoadShare::inflight_kv_tokens

  policy::LoadShare share() const {
    return {in_flight, pending_prefill_tokens, active_decode_tokens, pending_prefill_s, oldest_prefill_s,
            prefill_elapsed_s, inflight_kv_tokens};
  }
  static WorkerLoad of(std::string worker, const policy::LoadShare& s, double at) {
    return {std::move(worker), s.in_flight, s.pending_prefill_tokens, s.pending_prefill_s, s.oldest_prefill_s,
            s.active_decode_tokens, at, s.prefill_elapsed_s, s.inflight_kv_tokens};
  }
};

struct Routed {
  std::string worker;
  std::uint64_t root = 0;
  std::vector<hashing::BlockHash> hashes;
  std::uint64_t session = 0;  // hash of the session key bound to the worker; 0: none
  // What the request adds to the worker's load: the others add it at once, until the sender's next published
  // load (which carries the count of records it covers) includes it.
  policy::LoadShare load;
  std::uint64_t seq = 0;            // the sender's routed records so far, this one included
  std::uint32_t computes_from = 0;  // precise mode: the request computes hashes[computes_from..]
  double at_s = 0;                  // when it was routed (the sender's steady clock; not sent)
};

// An operator's change to the fleet, made on one replica and applied on all.
struct AdminChange {
  enum class Kind : std::uint8_t { kCordon, kUncordon, kAdd, kRemove };
  Kind kind = Kind::kCordon;
  std::string worker;  // URL
  std::string attrs;   // kAdd: the worker's attributes (encode_attrs)
};

// The admin state kept in Redis, read at (re)start.
struct AdminState {
  std::vector<std::string> cordoned;
  std::map<std::string, std::string> added;  // URL -> attributes
  std::vector<std::string> removed;
  // Redis holds nothing of this deployment (it restarted empty, or is new): the replicas' own view is the best
  // there is, and they write it back rather than take the empty state.
  bool fresh = false;
};

// "key\tvalue\n" lines (values without tabs or newlines), for a worker's attributes.
std::string encode_attrs(const std::vector<std::pair<std::string, std::string>>& attrs);
std::vector<std::pair<std::string, std::string>> decode_attrs(std::string_view text);

// What the replica does with what the others share. Every callback runs on the shared state's thread.
class Handler {
 public:
  virtual ~Handler() = default;
  virtual void apply_routed(const Routed& r) = 0;
  virtual void apply_session(std::uint64_t session, const std::string& worker) = 0;
  virtual void apply_response_owner(const std::string& id, const std::string& worker) = 0;
  virtual void apply_prefix_computed(const std::string& worker, hashing::BlockHash last) = 0;
  virtual void apply_admin(const AdminChange& c) = 0;
  virtual void apply_admin_state(const AdminState& s) = 0;
  virtual void apply_rates(const std::string& worker, const policy::WorkerRates& r) = 0;
  // The other replicas' load, summed per worker (replaces the previous sum).
  virtual void apply_remote_load(std::vector<WorkerLoad> load) = 0;
  virtual std::vector<WorkerLoad> local_load() = 0;
  virtual std::vector<std::pair<std::string, policy::WorkerRates>> local_rates() = 0;
  // Requests that ended per worker URL: this replica's, counted since it started (local_ended), and the other
  // replicas', counted since this one first read them (apply_others_ended; each call gives every worker's total).
  virtual std::vector<std::pair<std::string, std::uint64_t>> local_ended() = 0;
  virtual void apply_others_ended(const std::vector<std::pair<std::string, std::uint64_t>>& ended) = 0;
  // Redis became reachable (after a resync) or unreachable; `why` says what failed.
  virtual void up_changed(bool up, const std::string& why) = 0;
};

class SharedState {
 public:
  struct Options {
    RedisUrl url;
    std::string prefix = "kvroute";
    std::size_t queue_limit = 100'000;      // commands waiting to be sent; beyond, the oldest is dropped
    std::size_t queue_limit_blocks = 4'194'304;  // and the block hashes they carry (8 bytes each: 32 MB)
    std::size_t stream_maxlen = 200'000;    // XADD MAXLEN ~
    std::size_t warm_records = 200'000;     // records read back at (re)start
    std::chrono::milliseconds load_interval{25};
    std::chrono::milliseconds load_ttl{1000};
    std::chrono::milliseconds rates_interval{2000};
    std::chrono::milliseconds io_timeout{1000};  // a command that takes longer counts as Redis down
    double session_ttl_s = 600;
    double response_ttl_s = 86400;
  };
  struct Status {
    bool up = false;
    std::uint64_t published = 0, dropped = 0, applied = 0, resyncs = 0, reconnects = 0;
    std::size_t queued = 0, replicas = 0;
    std::string replica;  // this replica's id
    std::size_t rank = 0;       // Turn::rank
    double stream_delay_s = 0;  // Turn::stream_delay_s
    std::string url;      // RedisUrl::display(), without the password
    std::string prefix;
    std::string last_error;
  };

  SharedState(Options options, Handler& handler);
  ~SharedState();
  SharedState(const SharedState&) = delete;
  SharedState& operator=(const SharedState&) = delete;

  // Starts the thread and waits at most `warm` for it to connect and read the recent stream and admin state.
  // False when that did not happen in time: the replica starts alone and catches up once Redis answers.
  bool start(std::chrono::milliseconds warm);
  void stop();

  // Non-blocking; callable from any thread.
  void routed(std::string_view worker, std::uint64_t root, std::span<const hashing::BlockHash> hashes,
              std::uint64_t session, const policy::LoadShare& load = {}, std::uint32_t computes_from = 0);
  void response_owner(std::string_view id, std::string_view worker);
  // A request this replica sent to `worker` had its first token before the worker's KV event stored `last`,
  // the last block it computed: the others release the requests they hold for that prefix (prefix holds,
  // hashing/computing_prefixes.h) without waiting for the event.
  void prefix_computed(std::string_view worker, hashing::BlockHash last);
  void admin(const AdminChange& change);
  // Asks Redis for a binding this replica does not know; the answer, if any, comes through the handler.
  void lookup_session(std::uint64_t session);
  void lookup_response(std::string_view id);

  bool up() const { return up_.load(std::memory_order_relaxed); }
  Status status() const;

  // This replica's turn among the live ones, for taking turns in bursts (policy::BurstStagger).
  struct Turn {
    std::size_t rank = 0;       // its place among the running replicas, ordered by id (0 when alone)
    std::size_t replicas = 1;   // running replicas (a heartbeat in the last 5 s, busy or idle), this one included
    double stream_delay_s = 0;  // the time by which its routed records are back on the stream (read_back)
  };
  Turn turn() const;

 private:
  struct Command {
    std::vector<std::string> args;
    enum class Reply : std::uint8_t { kIgnore, kSession, kResponse } reply = Reply::kIgnore;
    std::string key;  // what a lookup asked for
    // A routed record as the request path handed it over (args empty): the thread encodes it.
    std::optional<Routed> routed;
  };
  void enqueue(Command c);
  // The XADD of a routed record, and the SET of the session it bound, appended to `out` (the thread).
  void encode_routed(Command& c, std::vector<Command>& out);
  // One of this replica's routed records came back on the stream (the thread): the stream's delay.
  void read_back(std::uint64_t seq);
  void lookup(Command::Reply reply, std::string_view space, std::string what);
  void run();
  bool connect();
  bool resync();
  bool flush();
  bool exchange_load();
  // Every second: this replica's heartbeat in P:members, and its rank among the replicas alive there (rank_,
  // members_), idle ones included, unlike the load's P:replicas.
  bool refresh_members();
  bool exchange_rates();
  bool check_trimmed();
  struct Conn;
  std::unique_ptr<Conn> open();  // a connection, authenticated and on its DB; null (last_error_ set) on failure
  // Waits up to `timeout` for new records (applied) or for commands to send; false when Redis failed.
  bool wait(std::chrono::steady_clock::duration timeout);
  // Reads the records after last_id_ without blocking, 5,000 at most; *got says how many came.
  bool catch_up(std::size_t* got);
  std::size_t apply_entries(const ::redisReply* r);
  void apply_record(std::span<const std::pair<std::string_view, std::string_view>> fields);
  void went_down(const std::string& why);
  void set_error(std::string e);
  std::string last_error_copy() const;
  std::string key(std::string_view name) const { return options_.prefix + ":" + std::string(name); }
  // An XADD of one record of `kind` to the stream (trimmed to about stream_maxlen), from this replica.
  std::vector<std::string> stream_record(std::string_view kind, std::initializer_list<std::string> fields) const;

  const Options options_;
  Handler& handler_;
  const std::string replica_;

  mutable std::mutex mu_;
  std::deque<Command> queue_;  // guarded by mu_
  std::size_t queued_blocks_ = 0;  // guarded by mu_: the block hashes queue_'s routed records carry
  // Guarded by mu_: routed records' chains the thread is done with, emptied, for the request path to fill again.
  // A chain is allocated on the request path and freed on this thread; without reuse, the allocator hands the
  // freed memory back to the system and the next request faults its pages in again (about 0.5 us of a 512-block
  // decision, BM_RouterRouteShared).
  std::vector<std::vector<hashing::BlockHash>> spare_chains_;
  void give_back_chain(std::vector<hashing::BlockHash>&& chain);  // caller holds mu_
  std::string last_error_;     // guarded by mu_
  std::atomic<std::uint64_t> published_{0}, dropped_{0}, applied_{0}, resyncs_{0}, reconnects_{0};
  std::atomic<std::size_t> replicas_{0};
  std::atomic<std::uint64_t> routed_seq_{0};  // routed records made here
  std::atomic<std::size_t> rank_{0};
  std::atomic<std::size_t> members_{1};
  std::atomic<double> stream_delay_s_{0.0};
  // The thread's own: routed records sent and not yet read back (seq, when routed), for stream_delay_s_.
  std::deque<std::pair<std::uint64_t, double>> in_transit_;
  double srtt_ = 0, rttvar_ = 0;  // the thread's: the stream delay's smoothed mean and deviation (read_back)
  std::atomic<bool> up_{false};
  std::atomic<bool> warm_{false};
  std::atomic<bool> told_down_attempted_{false};  // a first connection attempt failed (start() stops waiting)
  std::atomic<bool> stopping_{false};
  std::thread thread_;

  const int wakeup_;  // eventfd: the queue went from empty to not empty while the thread waited
  // The thread is in (or about to enter) its wait with an empty queue: only then does a new record write the
  // eventfd. While the thread is sending, it finds what came meanwhile without one (a write costs about 1 us).
  std::atomic<bool> waiting_{false};

  // Owned by the thread: one connection for commands, one for the reader's XREAD BLOCK.
  std::unique_ptr<Conn> conn_, reader_;
  bool reading_ = false;  // an XREAD is outstanding on reader_
  std::string last_id_ = "0-0";
  bool load_published_ = false;  // this replica's load key holds a non-empty load
  std::chrono::steady_clock::time_point members_at_{};  // the last refresh of P:members (refresh_members)
  std::uint64_t published_seq_ = 0;  // the routed records the last published load covered
  // The others' load as this replica knows it: each one's last published load, plus the load of the requests
  // it routed since (their records came on the stream after that load was taken), by replica id.
  struct Peer {
    std::uint64_t covered = 0;
    std::vector<WorkerLoad> load;
    std::vector<std::pair<std::uint64_t, WorkerLoad>> since;  // (seq, the request's load)
    std::chrono::steady_clock::time_point seen{};
  };
  std::map<std::string, Peer, std::less<>> peers_;
  bool peers_changed_ = false;  // records added load since the handler was last given the sum
  void give_remote_load();      // the sum over peers_ to the handler
  // Requests ended per worker, one count for all replicas in the hash P:ended (HINCRBY): what this replica has
  // added to it, its value when last read (none yet), and the others' ends, the changes it made that this
  // replica did not. A count that went back (Redis restarted empty, the hash expired) is read afresh.
  struct Ends {
    std::uint64_t sent = 0;
    std::optional<std::uint64_t> seen;
    std::uint64_t others = 0;
  };
  std::map<std::string, Ends, std::less<>> ends_;
  bool ends_read_ = false;  // the hash was read once
  bool exchange_ends();  // with every load exchange
  bool was_up_ = false, told_down_ = false;
};

}  // namespace kvroute::shared_state
