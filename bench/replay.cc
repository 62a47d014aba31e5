#include "bench/replay.h"

#include <unistd.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/json.hpp>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>

#include "bench/bounds.h"
#include "bench/generators.h"
#include "bench/runner.h"

namespace kvroute::bench {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// http://HOST:PORT[/] -> host, port. Only plain HTTP: replay measures latency, TLS would only add noise.
Result<std::pair<std::string, std::string>> parse_target(const std::string& t) {
  const std::string scheme = "http://";
  if (t.rfind(scheme, 0) != 0) return make_error("--target must look like http://HOST:PORT (got '" + t + "')");
  std::string rest = t.substr(scheme.size());
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  if (rest.find('/') != std::string::npos)
    return make_error("--target is the endpoint's base URL, without a path (got '" + t + "')");
  std::string host = rest, port = "80";
  const auto colon = rest.rfind(':');
  if (rest.size() > 0 && rest.front() == '[') {  // [v6]:port
    const auto close = rest.find(']');
    if (close == std::string::npos) return make_error("--target: unbalanced '[' in '" + t + "'");
    host = rest.substr(1, close - 1);
    if (close + 1 < rest.size() && rest[close + 1] == ':') port = rest.substr(close + 2);
  } else if (colon != std::string::npos) {
    host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
  }
  auto p = parse_count("--target port", port);
  if (host.empty() || !p || *p == 0 || *p > 65535) return make_error("--target: no valid host and port in '" + t + "'");
  return std::make_pair(host, port);
}


std::uint32_t json_u32(const boost::json::object& o, const char* key) {
  const auto* v = o.if_contains(key);
  if (!v) return 0;
  if (v->is_int64()) return static_cast<std::uint32_t>(std::max<std::int64_t>(0, v->get_int64()));
  if (v->is_uint64()) return static_cast<std::uint32_t>(v->get_uint64());
  return 0;
}

// True when `json` has `key` (quoted) followed by a non-empty string value: `"text":"x..."`. Keys inside
// string values are not told apart, which is fine for the token events of an OpenAI stream.
bool has_nonempty_string(std::string_view json, std::string_view key) {
  for (std::size_t at = json.find(key); at != std::string_view::npos; at = json.find(key, at + 1)) {
    std::size_t i = at + key.size();
    while (i < json.size() && (json[i] == ' ' || json[i] == '\t')) ++i;
    if (i >= json.size() || json[i] != ':') continue;
    ++i;
    while (i < json.size() && (json[i] == ' ' || json[i] == '\t')) ++i;
    if (i + 1 < json.size() && json[i] == '"' && json[i + 1] != '"') return true;
  }
  return false;
}

// Who a request belongs to, for the per-request lines: its session, else the generator's grouping key
// without the model prefix ("tenant3/user2", "group7"), which is what shows a router keeping related
// requests together.
std::string display_key(const Request& r) {
  if (r.session != 0) return "session " + std::to_string(r.session);
  std::string_view k = r.affinity_key;
  if (const auto slash = k.find('/'); slash != std::string_view::npos) k.remove_prefix(slash + 1);
  std::string out(k.substr(0, 20));
  for (char& c : out)
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
  return out;
}

class Replayer;

// One request: connect (or reuse a pooled keep-alive connection), write, read the header, then the body
// piece by piece as it arrives, parsing SSE events on the way. Owned by its pending operations.
class Exchange : public std::enable_shared_from_this<Exchange> {
 public:
  Exchange(Replayer& r, std::size_t index) : r_(r), index_(index) {}
  void start();

 private:
  void connect_fresh();
  void on_connect(beast::error_code ec);
  void write();
  void on_write(beast::error_code ec);
  void on_header(beast::error_code ec);
  void read_body();
  void on_body(beast::error_code ec);
  void consume(const char* data, std::size_t n, Clock::time_point t);
  void on_event(const std::string& data, Clock::time_point t);
  // A reused keep-alive connection the server closed in the meantime fails before any response byte: that
  // is not the request's fault, so it is retried once on a fresh connection.
  bool retry_stale(beast::error_code ec);
  void fail(const std::string& what, beast::error_code ec);
  void finish_error(std::string message);
  void finish();
  void arm();

  Replayer& r_;
  std::size_t index_;
  std::unique_ptr<beast::tcp_stream> stream_;
  bool reused_ = false;
  bool retried_ = false;
  http::request<http::string_body> req_;
  beast::flat_buffer buf_;
  std::optional<http::response_parser<http::buffer_body>> parser_;
  char chunk_[16384];
  bool sse_ = false;
  std::string pending_;  // SSE bytes not yet forming a whole event; or the whole body when not SSE
  Clock::time_point sent_, first_content_, last_content_;
  Clock::time_point deadline_;
};

class Replayer {
 public:
  Replayer(const Workload& w, const ReplayOptions& o, const std::function<void(const ReplayRecord&)>& on_done)
      : w_(w), o_(o), on_done_(on_done), timer_(ioc_) {}

  Result<ReplayRun> run() {
    beast::error_code ec;
    tcp::resolver resolver(ioc_);
    auto results = resolver.resolve(o_.host, o_.port, ec);
    if (ec || results.empty())
      return make_error("cannot resolve " + o_.host + ":" + o_.port + ": " + ec.message());
    endpoints_ = results;
    run_.records.resize(w_.requests.size());
    for (std::size_t i = 0; i < w_.requests.size(); ++i) {
      auto& rec = run_.records[i];
      rec.id = w_.requests[i].id;
      rec.session = w_.requests[i].session;
      rec.prompt_tokens = w_.requests[i].prompt_tokens;
      rec.who = display_key(w_.requests[i]);
    }
    // Start a little in the future so the first arrivals are not late because of setup.
    start_ = Clock::now() + std::chrono::milliseconds(20);
    schedule();
    ioc_.run();
    run_.wall_s = std::chrono::duration<double>(Clock::now() - start_).count();
    for (const auto& rec : run_.records) {
      if (!rec.ok) ++run_.errors;
      if (rec.delayed) ++run_.delayed;
      if (rec.ok && !rec.worker.empty()) ++run_.per_worker[rec.worker];
    }
    return std::move(run_);
  }

  std::size_t finished() const { return finished_; }

 private:
  friend class Exchange;

  Clock::time_point due(std::size_t i) const {
    const double s = w_.requests[i].arrival_s / o_.rate_scale / o_.speed;
    return start_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  }

  // Launches every request whose time has come, then sleeps until the next one.
  void schedule() {
    const auto now = Clock::now();
    while (next_ < w_.requests.size() && due(next_) <= now) {
      if (in_flight_ < o_.concurrency_limit) {
        launch(next_);
      } else {
        run_.records[next_].delayed = true;
        waiting_.push_back(next_);
      }
      ++next_;
    }
    if (next_ < w_.requests.size()) {
      timer_.expires_at(due(next_));
      timer_.async_wait([this](beast::error_code ec) {
        if (!ec) schedule();
      });
    }
  }

  void launch(std::size_t i) {
    ++in_flight_;
    std::make_shared<Exchange>(*this, i)->start();
  }

  // Called by an Exchange exactly once, after its record is complete.
  void done(std::size_t i, std::unique_ptr<beast::tcp_stream> keep) {
    if (keep && idle_.size() < o_.concurrency_limit) idle_.push_back(std::move(keep));
    --in_flight_;
    ++finished_;
    if (on_done_) on_done_(run_.records[i]);
    if (o_.progress && !o_.verbose && isatty(STDERR_FILENO) && Clock::now() >= next_progress_) {
      next_progress_ = Clock::now() + std::chrono::milliseconds(500);
      std::fprintf(stderr, "\r\033[K[replay] %zu/%zu done, %zu in flight", finished_, w_.requests.size(), in_flight_);
      std::fflush(stderr);
    }
    while (!waiting_.empty() && in_flight_ < o_.concurrency_limit) {
      const std::size_t k = waiting_.front();
      waiting_.pop_front();
      launch(k);
    }
  }

  std::unique_ptr<beast::tcp_stream> take_idle() {
    if (idle_.empty()) return nullptr;
    auto s = std::move(idle_.back());
    idle_.pop_back();
    return s;
  }

  const Workload& w_;
  const ReplayOptions& o_;
  const std::function<void(const ReplayRecord&)>& on_done_;
  net::io_context ioc_{1};
  net::steady_timer timer_;
  tcp::resolver::results_type endpoints_;
  Clock::time_point start_;
  Clock::time_point next_progress_{};
  std::size_t next_ = 0;
  std::size_t in_flight_ = 0;
  std::size_t finished_ = 0;
  std::deque<std::size_t> waiting_;
  std::vector<std::unique_ptr<beast::tcp_stream>> idle_;
  ReplayRun run_;
};

void Exchange::start() {
  const Request& q = r_.w_.requests[index_];
  req_ = {http::verb::post, r_.o_.path, 11};
  req_.set(http::field::host, r_.o_.host + ":" + r_.o_.port);
  req_.set(http::field::user_agent, "kvroute-bench-replay");
  req_.set(http::field::content_type, "application/json");
  req_.set("x-request-id", "replay-" + std::to_string(q.id));
  if (q.session != 0) req_.set("x-session-id", "session-" + std::to_string(q.session));
  req_.keep_alive(true);
  req_.body() = replay_request_body(q, r_.o_.model);
  req_.prepare_payload();
  deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(r_.o_.timeout_s));
  sent_ = Clock::now();
  r_.run_.records[index_].send_s = std::chrono::duration<double>(sent_ - r_.start_).count() * r_.o_.speed;
  stream_ = r_.take_idle();
  if (stream_) {
    reused_ = true;
    write();
  } else {
    connect_fresh();
  }
}

void Exchange::arm() { stream_->expires_at(deadline_); }

void Exchange::connect_fresh() {
  reused_ = false;
  stream_ = std::make_unique<beast::tcp_stream>(r_.ioc_);
  arm();
  stream_->async_connect(r_.endpoints_, [self = shared_from_this()](beast::error_code ec, const tcp::endpoint&) {
    self->on_connect(ec);
  });
}

void Exchange::on_connect(beast::error_code ec) {
  if (ec) return fail("connect", ec);
  stream_->socket().set_option(tcp::no_delay(true), ec);  // small request bodies must not wait for Nagle
  write();
}

void Exchange::write() {
  arm();
  http::async_write(*stream_, req_, [self = shared_from_this()](beast::error_code ec, std::size_t) {
    self->on_write(ec);
  });
}

void Exchange::on_write(beast::error_code ec) {
  if (ec) {
    if (retry_stale(ec)) return;
    return fail("write", ec);
  }
  parser_.emplace();
  parser_->body_limit(std::numeric_limits<std::uint64_t>::max());  // a long stream is fine; the deadline bounds it
  arm();
  http::async_read_header(*stream_, buf_, *parser_, [self = shared_from_this()](beast::error_code ec, std::size_t) {
    self->on_header(ec);
  });
}

bool Exchange::retry_stale(beast::error_code ec) {
  if (!reused_ || retried_ || ec == beast::error::timeout) return false;
  retried_ = true;
  beast::error_code ignored;
  stream_->socket().close(ignored);
  buf_.clear();
  connect_fresh();
  return true;
}

void Exchange::on_header(beast::error_code ec) {
  if (ec) {
    if (retry_stale(ec)) return;
    return fail("read header", ec);
  }
  auto& rec = r_.run_.records[index_];
  const auto& res = parser_->get();
  rec.status = static_cast<int>(res.result_int());
  rec.worker = std::string(res["x-kvroute-worker"]);
  const std::string ctype(res[http::field::content_type]);
  sse_ = ctype.find("text/event-stream") != std::string::npos;
  if (parser_->is_done()) return finish();
  read_body();
}

void Exchange::read_body() {
  auto& body = parser_->get().body();
  body.data = chunk_;
  body.size = sizeof chunk_;
  arm();
  http::async_read_some(*stream_, buf_, *parser_, [self = shared_from_this()](beast::error_code ec, std::size_t) {
    self->on_body(ec);
  });
}

void Exchange::on_body(beast::error_code ec) {
  if (ec == http::error::need_buffer) ec = {};  // our chunk filled up: not an error
  const auto now = Clock::now();
  const std::size_t got = sizeof chunk_ - parser_->get().body().size;
  if (got > 0) consume(chunk_, got, now);
  if (ec && !parser_->is_done()) return fail("read body", ec);
  if (parser_->is_done()) return finish();
  read_body();
}

void Exchange::consume(const char* data, std::size_t n, Clock::time_point t) {
  auto& rec = r_.run_.records[index_];
  if (!sse_ || rec.status != 200) {
    // Error bodies and non-streamed JSON are kept whole (bounded) and read at the end.
    if (pending_.size() < (64u << 20)) pending_.append(data, n);
    return;
  }
  for (std::size_t i = 0; i < n; ++i)
    if (data[i] != '\r') pending_.push_back(data[i]);  // SSE allows CRLF; one separator is simpler to scan
  std::size_t start = 0;
  for (std::size_t end; (end = pending_.find("\n\n", start)) != std::string::npos; start = end + 2) {
    // An event: its "data:" lines joined by newlines (the SSE spec); other fields are ignored.
    std::string payload;
    std::size_t line = start;
    while (line < end) {
      std::size_t eol = pending_.find('\n', line);
      if (eol == std::string::npos || eol > end) eol = end;
      std::string_view l(pending_.data() + line, eol - line);
      if (l.rfind("data:", 0) == 0) {
        l.remove_prefix(5);
        if (!l.empty() && l.front() == ' ') l.remove_prefix(1);
        if (!payload.empty()) payload.push_back('\n');
        payload.append(l);
      }
      line = eol + 1;
    }
    if (!payload.empty()) on_event(payload, t);
  }
  pending_.erase(0, start);
}

void Exchange::on_event(const std::string& data, Clock::time_point t) {
  if (data == "[DONE]") return;
  auto& rec = r_.run_.records[index_];
  if (data.find("\"usage\"") == std::string::npos) {
    // Fast path for the hundreds of token events per request: a scan, not a JSON parse, keeps the client's
    // own CPU time (which lands in the measured latencies on a busy machine) small.
    if (has_nonempty_string(data, "\"text\"") || has_nonempty_string(data, "\"content\"")) {
      if (rec.content_events == 0) first_content_ = t;
      last_content_ = t;
      ++rec.content_events;
    }
    return;
  }
  boost::json::error_code jec;
  boost::json::value v = boost::json::parse(data, jec);
  if (jec || !v.is_object()) return;  // not ours to judge; a missing usage is reported at the end
  const auto& o = v.get_object();
  bool content = false;
  if (const auto* ch = o.if_contains("choices"); ch && ch->is_array() && !ch->get_array().empty()) {
    const auto& c0 = ch->get_array()[0];
    if (c0.is_object()) {
      const auto& c = c0.get_object();
      if (const auto* text = c.if_contains("text"); text && text->is_string() && !text->get_string().empty())
        content = true;
      if (const auto* d = c.if_contains("delta"); d && d->is_object()) {
        const auto* dc = d->get_object().if_contains("content");
        if (dc && dc->is_string() && !dc->get_string().empty()) content = true;
      }
    }
  }
  if (content) {
    if (rec.content_events == 0) first_content_ = t;
    last_content_ = t;
    ++rec.content_events;
  }
  if (const auto* u = o.if_contains("usage"); u && u->is_object()) {
    const auto& uo = u->get_object();
    rec.has_usage = true;
    rec.prompt_tokens = json_u32(uo, "prompt_tokens");
    rec.completion_tokens = json_u32(uo, "completion_tokens");
    if (const auto* d = uo.if_contains("prompt_tokens_details"); d && d->is_object())
      rec.cached_tokens = json_u32(d->get_object(), "cached_tokens");
  }
}

void Exchange::fail(const std::string& what, beast::error_code ec) {
  finish_error(what + ": " + (ec == beast::error::timeout ? std::string("timed out") : ec.message()));
}

void Exchange::finish_error(std::string message) {
  auto& rec = r_.run_.records[index_];
  rec.ok = false;
  rec.error = std::move(message);
  rec.e2e_s = std::chrono::duration<double>(Clock::now() - sent_).count() * r_.o_.speed;
  if (stream_) {
    beast::error_code ignored;
    stream_->socket().close(ignored);
  }
  r_.done(index_, nullptr);
}

void Exchange::finish() {
  const auto now = Clock::now();
  auto& rec = r_.run_.records[index_];
  const double speed = r_.o_.speed;
  rec.e2e_s = std::chrono::duration<double>(now - sent_).count() * speed;
  if (rec.status != 200) {
    std::string body = pending_.substr(0, 300);
    std::replace(body.begin(), body.end(), '\n', ' ');
    return finish_error("HTTP " + std::to_string(rec.status) + ": " + body);
  }
  if (!sse_) {
    // The endpoint did not stream: the whole answer is the first token.
    boost::json::error_code jec;
    boost::json::value v = boost::json::parse(pending_, jec);
    if (!jec && v.is_object()) {
      const auto* u = v.get_object().if_contains("usage");
      if (u && u->is_object()) {
        rec.has_usage = true;
        rec.prompt_tokens = json_u32(u->get_object(), "prompt_tokens");
        rec.completion_tokens = json_u32(u->get_object(), "completion_tokens");
        const auto* d = u->get_object().if_contains("prompt_tokens_details");
        if (d && d->is_object()) rec.cached_tokens = json_u32(d->get_object(), "cached_tokens");
      }
    }
    first_content_ = last_content_ = now;
    rec.content_events = 1;
  }
  if (rec.content_events == 0) return finish_error("the response carried no generated text");
  if (!rec.has_usage)
    return finish_error("no usage in the response (the endpoint ignores stream_options.include_usage?)");
  rec.ttft_s = std::chrono::duration<double>(first_content_ - sent_).count() * speed;
  rec.decode_s = std::chrono::duration<double>(last_content_ - first_content_).count() * speed;
  rec.ok = true;
  std::unique_ptr<beast::tcp_stream> keep;
  if (parser_->get().keep_alive() && parser_->is_done() && buf_.size() == 0) keep = std::move(stream_);
  r_.done(index_, std::move(keep));
}

}  // namespace

std::string replay_usage() {
  std::string gens;
  for (const auto& g : generator_names()) gens += (gens.empty() ? "" : ", ") + g;
  return "usage: kvroute-bench replay --target http://HOST:PORT (--trace FILE | --workload NAME) [options]\n"
         "\n"
         "Sends the arrivals of a trace or generated workload (the same ones `simulate` uses) to an\n"
         "OpenAI-compatible endpoint as streamed /v1/completions with token-id prompts, measures TTFT,\n"
         "inter-token and end-to-end latency at the client, reads usage.prompt_tokens_details.cached_tokens, and\n"
         "prints the same table as `simulate`.\n"
         "\n"
         "  --target URL            the endpoint, http://HOST:PORT (kvroute, or any OpenAI-compatible server)\n"
         "  --trace FILE            Mooncake-format trace (JSON lines)\n"
         "  --workload NAME         built-in generator: " + gens + "\n"
         "  --speed X               the workers run X times faster than real time (kvroute-sim --speed X):\n"
         "                          arrivals are sent X times sooner and latencies multiplied by X (default 1)\n"
         "  --rate-scale X          divide arrival times by X (X > 1: higher request rate; default 1)\n"
         "  --request-rate R        instead of --rate-scale: scale arrivals to R requests per (model) second on\n"
         "                          average, whatever the source's own rate\n"
         "  --max-requests N        only the first N requests\n"
         "  --concurrency-limit N   at most N requests in flight; later arrivals wait (default 512)\n"
         "  --timeout S             wall seconds allowed per request, streaming included (default 300)\n"
         "  --model NAME            the requests' model (default qwen3-8b)\n"
         "  --gpu NAME              GPU profile assumed for the capacity-bound hit rate (default h100-80gb)\n"
         "  --seed N                seed of the generators (default 1)\n"
         "  --json FILE             write the results as JSON (simulate's shape, plus target and errors)\n"
         "  --label NAME            the row's name in the table and JSON (default replay)\n"
         "  --verbose               one line per request: id, session, prompt and cached tokens, worker, TTFT\n"
         "  --no-progress           no progress line on stderr\n"
         "\n"
         "Exit status: 0 when at least one request completed (errors are counted in the report), 1 otherwise,\n"
         "2 for bad arguments.\n";
}

Result<ReplayOptions> parse_replay_args(const std::vector<std::string>& args) {
  ReplayOptions o;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") return make_error(replay_usage());
    if (a == "--verbose" || a == "-v") {
      o.verbose = true;
      continue;
    }
    if (a == "--no-progress") {
      o.progress = false;
      continue;
    }
    if (i + 1 >= args.size()) return make_error(a + " needs a value (see --help)");
    const std::string& v = args[++i];
    if (a == "--target") o.target = v;
    else if (a == "--trace") o.trace = v;
    else if (a == "--workload") o.workload = v;
    else if (a == "--model") o.model = v;
    else if (a == "--gpu") o.gpu = v;
    else if (a == "--json") o.json_path = v;
    else if (a == "--label") o.label = v;
    else if (a == "--max-requests" || a == "--concurrency-limit" || a == "--seed") {
      auto n = parse_count(a, v);
      if (!n) return n.error();
      if (a == "--max-requests") o.max_requests = *n;
      else if (a == "--seed") o.seed = *n;
      else {
        if (*n == 0) return make_error("--concurrency-limit must be at least 1");
        o.concurrency_limit = *n;
      }
    } else if (a == "--speed" || a == "--rate-scale" || a == "--timeout" || a == "--request-rate") {
      auto d = parse_double(a, v, 1e-9);
      if (!d) return d.error();
      if (a == "--speed") o.speed = *d;
      else if (a == "--rate-scale") o.rate_scale = *d;
      else if (a == "--request-rate") o.request_rate = *d;
      else o.timeout_s = *d;
    } else {
      return make_error("unknown option '" + a + "' (see --help)");
    }
  }
  if (o.target.empty()) return make_error("--target http://HOST:PORT is required");
  auto hp = parse_target(o.target);
  if (!hp) return hp.error();
  o.host = hp->first;
  o.port = hp->second;
  if (o.trace.empty() == o.workload.empty()) return make_error("give exactly one of --trace FILE or --workload NAME");
  return o;
}

Result<Workload> load_replay_workload(const ReplayOptions& o) {
  BenchConfig c;
  c.trace = o.trace;
  c.workload = o.workload;
  c.sim.model = o.model;
  c.sim.seed = o.seed;
  c.max_requests = o.max_requests;
  return load_workload(c);
}

std::vector<std::uint32_t> prompt_token_ids(const Request& r) {
  std::vector<std::uint32_t> ids;
  ids.reserve(r.prompt_tokens);
  for (hashing::BlockHash h : r.chain.hashes) {
    for (std::uint64_t j = 0; j < kBlockTokens && ids.size() < r.prompt_tokens; ++j)
      ids.push_back(static_cast<std::uint32_t>(splitmix64(h + j) % 100000 + 1000));
  }
  // The tail fills no block, so no other request can share it; keyed by the request so it never matches
  // another request's tail by accident either.
  const std::uint64_t tail = splitmix64(r.id ^ 0x7461696cull) ^ (r.chain.hashes.empty() ? 0 : r.chain.hashes.back());
  for (std::uint64_t j = 0; ids.size() < r.prompt_tokens; ++j)
    ids.push_back(static_cast<std::uint32_t>(splitmix64(tail + j) % 100000 + 1000));
  return ids;
}

std::string replay_request_body(const Request& r, const std::string& model) {
  const std::vector<std::uint32_t> ids = prompt_token_ids(r);
  std::string body;
  body.reserve(ids.size() * 7 + 200);
  body += "{\"model\":";
  body += boost::json::serialize(boost::json::value(model));
  body += ",\"prompt\":[";
  char num[16];
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (i) body.push_back(',');
    auto [p, ec] = std::to_chars(num, num + sizeof num, ids[i]);
    body.append(num, p);
  }
  body += "],\"max_tokens\":" + std::to_string(r.output_tokens) +
          ",\"ignore_eos\":true,\"stream\":true,\"stream_options\":{\"include_usage\":true}}";
  return body;
}

Result<ReplayRun> replay(const Workload& workload, const ReplayOptions& options,
                         const std::function<void(const ReplayRecord&)>& on_done) {
  ReplayOptions o = options;
  if (o.host.empty()) {
    auto hp = parse_target(o.target);
    if (!hp) return hp.error();
    o.host = hp->first;
    o.port = hp->second;
  }
  if (!(o.speed > 0) || !(o.rate_scale > 0)) return make_error("--speed and --rate-scale must be > 0");
  o.concurrency_limit = std::max<std::size_t>(o.concurrency_limit, 1);
  Replayer r(workload, o, on_done);
  return r.run();
}

PolicyResult summarize_replay(const ReplayRun& run, const std::string& label) {
  PolicyResult res;
  res.name = label;
  res.mode = IndexMode::kNone;
  RequestTally tally;
  for (const ReplayRecord& r : run.records) {
    if (!r.ok) continue;
    // Token-weighted like the simulator: decode time over the tokens after the first. Usage gives the
    // token count; an endpoint may pack several tokens into one event, so events would overstate the gap.
    const std::uint32_t tokens = r.completion_tokens ? r.completion_tokens : r.content_events;
    tally.add(r.ttft_s, r.e2e_s, r.decode_s, tokens, r.cached_tokens, r.prompt_tokens, r.completion_tokens, r.send_s,
              r.send_s + r.e2e_s);
  }
  res.output_tok_s = tally.fill(res);
  std::vector<double> per_worker;
  for (const auto& [w, n] : run.per_worker) per_worker.push_back(static_cast<double>(n));
  res.load_cov = res.requests_cov = coefficient_of_variation(per_worker);
  return res;
}

RunReport replay_report(const Workload& workload, const ReplayOptions& options, const ReplayRun& run) {
  RunReport rep;
  rep.workload = workload.name;
  rep.workers = run.per_worker.size();
  rep.rate_scale = options.rate_scale;
  SimOptions so;
  so.workers = std::max<std::size_t>(rep.workers, 1);
  so.model = options.model;
  so.gpu = options.gpu;
  if (auto b = compute_bounds(workload, so)) {
    rep.upper_bound_hit_rate = b->upper;
    rep.capacity_bound_hit_rate = b->capacity;
  } else {
    rep.upper_bound_hit_rate = upper_bound_hit_rate(workload);  // unknown profile: no capacity bound
  }
  rep.policies.push_back(summarize_replay(run, options.label));
  return rep;
}

namespace {

std::string verbose_line(const ReplayRecord& r) {
  char line[320];
  const std::string who = r.who.empty() ? "-" : r.who;
  if (!r.ok) {
    std::snprintf(line, sizeof line, "req %4llu  %-14s  prompt %6u  ERROR %s", (unsigned long long)r.id, who.c_str(),
                  r.prompt_tokens, r.error.substr(0, 120).c_str());
    return line;
  }
  char pct[16];
  std::snprintf(pct, sizeof pct, "(%.0f%%)", r.prompt_tokens ? 100.0 * r.cached_tokens / r.prompt_tokens : 0.0);
  std::snprintf(line, sizeof line, "req %4llu  %-14s  prompt %6u  cached %6u %-6s  worker %-15s  ttft %6.3f s",
                (unsigned long long)r.id, who.c_str(), r.prompt_tokens, r.cached_tokens, pct,
                r.worker.empty() ? "?" : r.worker.c_str(), r.ttft_s);
  return line;
}

}  // namespace

int run_replay_command(const std::vector<std::string>& args) {
  auto opts = parse_replay_args(args);
  if (!opts) return report_args_error("kvroute-bench replay", opts.error());
  auto workload = load_replay_workload(*opts);
  if (int rc = report_workload_error("kvroute-bench replay", workload)) return rc;
  if (opts->request_rate > 0 && workload->duration_s() > 0)
    opts->rate_scale = opts->request_rate * workload->duration_s() / static_cast<double>(workload->requests.size());
  std::fprintf(stderr, "[replay] %s: %zu requests, %llu prompt tokens, %.1f s of arrivals -> %s (speed x%g, rate x%g: %.1f s wall)\n",
               workload->name.c_str(), workload->requests.size(),
               static_cast<unsigned long long>(workload->prompt_tokens()), workload->duration_s(),
               opts->target.c_str(), opts->speed, opts->rate_scale,
               workload->duration_s() / opts->rate_scale / opts->speed);
  std::function<void(const ReplayRecord&)> on_done;
  if (opts->verbose) on_done = [](const ReplayRecord& r) { std::cout << verbose_line(r) << "\n" << std::flush; };
  auto run = replay(*workload, *opts, on_done);
  if (opts->progress && !opts->verbose && isatty(STDERR_FILENO)) std::cerr << "\r\033[K";
  if (!run) {
    std::cerr << "kvroute-bench replay: " << run.error().message << "\n";
    return 1;
  }
  const RunReport rep = replay_report(*workload, *opts, *run);
  std::cout << format_table(rep);
  std::string per_worker;
  for (const auto& [w, n] : run->per_worker) per_worker += "  " + w + " " + std::to_string(n);
  std::cout << "requests per worker:" << (per_worker.empty() ? "  (no x-kvroute-worker header)" : per_worker) << "\n";
  if (run->errors > 0) {
    std::cout << run->errors << " of " << run->records.size() << " requests failed; first errors:\n";
    std::size_t shown = 0;
    for (const auto& r : run->records) {
      if (r.ok || shown >= 5) continue;
      std::cout << "  req " << r.id << ": " << r.error << "\n";
      ++shown;
    }
  }
  if (run->delayed > 0)
    std::cout << run->delayed << " requests waited for the concurrency limit (" << opts->concurrency_limit
              << "); their latency is measured from when they were sent\n";
  std::cerr << "[replay] finished in " << run->wall_s << " s wall\n";
  if (!opts->json_path.empty()) {
    boost::json::error_code jec;
    boost::json::value doc = boost::json::parse(to_json({rep}), jec);
    if (!jec && doc.is_object()) {
      auto& o = doc.get_object();
      o["target"] = opts->target;
      o["speed"] = opts->speed;
      o["requests"] = run->records.size();
      o["errors"] = run->errors;
      o["delayed"] = run->delayed;
      boost::json::object pw;
      for (const auto& [w, n] : run->per_worker) pw[w] = n;
      o["requests_per_worker"] = std::move(pw);
    }
    std::ofstream f(opts->json_path);
    f << boost::json::serialize(doc) << "\n";
    if (!f) {
      std::cerr << "kvroute-bench replay: cannot write " << opts->json_path << "\n";
      return 1;
    }
  }
  const std::size_t completed = run->records.size() - run->errors;
  return completed > 0 ? 0 : 1;
}

}  // namespace kvroute::bench
