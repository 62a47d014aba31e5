#include "router/http_server.h"

#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <iostream>
#include <random>
#include <set>

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <boost/json.hpp>

#include "net/resource_errors.h"
#include "router/log.h"
#include "router/usage.h"
#include "util/split.h"

namespace kvroute::router {

namespace beast = boost::beast;
namespace http = beast::http;
namespace asio = boost::asio;
namespace json = boost::json;
using tcp = asio::ip::tcp;

namespace {

constexpr std::size_t kHeaderLimit = 64 * 1024;
constexpr std::size_t kRelayChunk = 16 * 1024;
constexpr std::size_t kClientReadChunk = 16 * 1024;
constexpr std::size_t kResponseIdHead = 64 * 1024;  // bytes of a Responses API body searched for its id
// Response id lookups (one GET per worker each) under way at once; beyond this a request is routed without one,
// so that a flood of made-up ids cannot multiply into a flood of requests to the workers.
constexpr std::size_t kMaxResponseLookups = 64;
std::atomic<std::size_t> response_lookups_in_flight{0};
constexpr std::size_t kUsageTail = 16 * 1024;  // bytes of the response end kept to read `usage` from
// How long an exchange runs before the router watches its client for a disconnect. Each wait costs a system
// call (the reactor re-arms the socket), a seventh of all a short relayed request makes; a client that leaves
// sooner is noticed that much later, or when its response is written.
constexpr auto kWatchClientAfter = std::chrono::milliseconds(200);
constexpr int kMaxReroutes = 2;  // other workers tried for a request whose worker refused the connection

std::chrono::steady_clock::duration seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}

std::string fmt_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", s);
  return buf;
}

Error no_healthy_worker() {
  return make_error("no healthy worker is available", 503, "service_unavailable", "no_healthy_worker");
}

std::string new_request_id() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id(32, '0');
  for (int half = 0; half < 2; ++half) {
    std::uint64_t x = rng();
    for (int i = 0; i < 16; ++i, x >>= 4) id[half * 16 + i] = kHex[x & 15];
  }
  return id;
}

bool hop_by_hop(http::field f, std::string_view name) {
  switch (f) {
    case http::field::connection:
    case http::field::keep_alive:
    case http::field::proxy_authenticate:
    case http::field::proxy_authorization:
    case http::field::te:
    case http::field::trailer:
    case http::field::transfer_encoding:
    case http::field::upgrade:
    case http::field::content_length:
    case http::field::host:
    case http::field::expect:  // the router answers it itself, and forwards requests whole
      return true;
    default:
      return beast::iequals(name, "proxy-connection");
  }
}

// Moves every complete event ("\n\n"-terminated) from `pending` to `out`, except a usage-only event (the extra
// event a router-requested include_usage produces), whose usage goes to `usage`. At the end of the stream
// whatever remains is passed on as it is.
void take_complete_events(std::string& pending, std::string& out, bool last, std::optional<Usage>& usage) {
  std::size_t start = 0;
  while (true) {
    const std::size_t end = pending.find("\n\n", start);
    if (end == std::string::npos) break;
    const std::string_view event(pending.data() + start, end + 2 - start);
    const std::size_t data = event.find("data:");
    std::optional<Usage> only = data == std::string_view::npos ? std::nullopt : usage_only_chunk(event.substr(data + 5));
    if (only) usage = only;
    else out.append(event);
    start = end + 2;
  }
  pending.erase(0, start);
  if (last) {
    out.append(pending);
    pending.clear();
  }
}

// Inference routes that vLLM and SGLang serve outside /v1/, passed through like /v1/* ones. Workers' control
// routes (/flush_cache, /load, ...) are not: they would reach one worker of many.
bool passed_through_root_route(std::string_view path) {
  static constexpr std::string_view kRoutes[] = {"/tokenize", "/detokenize", "/pooling", "/classify", "/score",
                                                 "/rerank",   "/generate",   "/encode"};
  return std::find(std::begin(kRoutes), std::end(kRoutes), path) != std::end(kRoutes);
}

// The workers to ask in a fan-out (models, response lookups, LoRA updates), read once: a worker whose health
// changes meanwhile must not be counted in one pass and skipped in another, or the fan-out never completes.
std::vector<std::shared_ptr<backends::Worker>> healthy_workers(const backends::WorkerRegistry& registry) {
  std::vector<std::shared_ptr<backends::Worker>> out;
  const auto workers = registry.snapshot();
  for (const auto& w : *workers) {
    if (w->healthy()) out.push_back(w);
  }
  return out;
}

// Appends one "name: value" header line.
void append_field(std::string& head, std::string_view name, std::string_view value) {
  head.append(name);
  head.append(": ");
  head.append(value);
  head.append("\r\n");
}

// The buffers of one relayed write, at most five: head, chunk-size line, data, CRLF, last chunk. The relay
// builds each message head as one string instead of letting Beast's serializer hand the socket every
// start-line part and header field as a separate buffer: iterating those was the largest user-space cost of
// a relayed request (docs/overhead.md).
struct Pieces {
  using value_type = asio::const_buffer;
  using const_iterator = const asio::const_buffer*;
  std::array<asio::const_buffer, 5> b;
  std::size_t n = 0;
  void add(const void* data, std::size_t size) {
    if (size > 0) b[n++] = asio::const_buffer(data, size);
  }
  const_iterator begin() const { return b.data(); }
  const_iterator end() const { return b.data() + n; }
};

template <class Body>
void common_headers(http::response<Body>& res, const std::string& request_id) {
  res.set(http::field::server, "kvroute");
  if (!request_id.empty()) res.set("x-request-id", request_id);
}

// ---------------------------------------------------------------------------------------------------------

// A deadline that moves without timer operations: set() records the time point and arms the timer only when
// it is not armed yet; a timer that fires before the recorded point (the deadline moved on since) is armed
// again (the point only moves later: every set() is now plus the same timeout). `due` runs once the recorded
// point has passed; the owner decides there whether it still applies.
// The owner is held weakly, so a pending deadline never keeps it alive.
template <class Owner>
class LazyDeadline {
 public:
  LazyDeadline(const asio::any_io_executor& ex, void (Owner::*due)()) : timer_(ex), due_(due) {}

  void set(std::chrono::steady_clock::time_point at, std::weak_ptr<Owner> owner) {
    at_ = at;
    if (!armed_) arm(std::move(owner));
  }
  void cancel() { timer_.cancel(); }

 private:
  void arm(std::weak_ptr<Owner> owner) {
    armed_ = true;
    timer_.expires_at(at_);
    timer_.async_wait([this, owner = std::move(owner)](beast::error_code ec) mutable {
      auto self = owner.lock();
      if (!self) return;  // the owner, and this member of it, are gone
      armed_ = false;
      if (ec) return;
      if (std::chrono::steady_clock::now() < at_) return arm(std::move(owner));
      ((*self).*due_)();
    });
  }

  asio::steady_timer timer_;
  void (Owner::*due_)();
  std::chrono::steady_clock::time_point at_;
  bool armed_ = false;
};

class ApiSession : public std::enable_shared_from_this<ApiSession> {
 public:
  ApiSession(tcp::socket&& socket, Services& svc, Listener::Kind kind)
      : stream_(std::move(socket)),
        svc_(svc),
        kind_(kind),
        drain_(svc.drain),
        bodies_(svc.bodies),
        access_log_(svc.config.access_log) {}
  // Not svc_: at shutdown sessions outlive the services. A hold's watch needs no cleanup here: the hold timer
  // keeps the session alive until the hold ends, and a watch left by one destroyed at shutdown only posts a
  // wake-up that finds no session.
  ~ApiSession() { end_exchange(); }

  void run() {
    asio::dispatch(stream_.get_executor(), beast::bind_front_handler(&ApiSession::do_read, shared_from_this()));
  }

 private:
  // ---- reading requests ----
  // A request is read with plain socket reads and parsed here (Beast's composed read costs several layers of
  // handlers per request). --client-idle-timeout bounds the whole read, from do_read on.
  void do_read() {
    end_exchange();
    continue_sent_ = false;
    parser_.emplace();
    parser_->header_limit(kHeaderLimit);
    parser_->body_limit(svc_.config.max_body_bytes);
    parser_->eager(true);
    reading_ = true;
    idle_.set(std::chrono::steady_clock::now() + seconds(svc_.config.client_idle_timeout_s), weak_from_this());
    read_request();
  }

  void read_request() {
    beast::error_code ec;
    while (buffer_.size() > 0 && !parser_->is_done()) {
      const std::size_t n = parser_->put(buffer_.data(), ec);
      buffer_.consume(n);
      if (ec == http::error::need_more) {
        ec = {};
        break;
      }
      if (ec || n == 0) break;
    }
    if (!ec && parser_->is_header_done() && kind_ == Listener::Kind::kApi && bodies_) {
      // The body bytes held, and one more read's worth while the body is still coming: what is received
      // counts, not what a header declares (a client that declares 8 MB and sends nothing holds one read).
      const std::uint64_t have = parser_->get().body().size();
      const std::uint64_t want = parser_->is_done() ? have : have + kClientReadChunk;
      if (want > body_reserved_) {
        if (!bodies_->try_reserve(want - body_reserved_, body_reserved_)) return wait_for_body_budget();
        body_reserved_ = want;
      }
    }
    if (ec || parser_->is_done()) return on_read(ec, 0);
    if (parser_->is_header_done() && !continue_sent_ && parser_->get().version() >= 11 &&
        beast::iequals(parser_->get()[http::field::expect], "100-continue")) {
      // The client waits for this before it sends the body (curl does for bodies over 1 MB, for a second).
      // A body over --max-body-bytes has failed the parse already: it gets its 413 instead.
      continue_sent_ = true;
      static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      return asio::async_write(stream_.socket(), asio::buffer(kContinue.data(), kContinue.size()),
                               [self = shared_from_this()](beast::error_code wec, std::size_t) {
                                 if (wec) return self->on_read(wec, 0);
                                 self->read_request();
                               });
    }
    stream_.socket().async_read_some(buffer_.prepare(kClientReadChunk),
                                     beast::bind_front_handler(&ApiSession::on_client_bytes, shared_from_this()));
  }

  // --max-held-body-bytes are held: read nothing more of this request (its client is held back by TCP) and try
  // again shortly. --client-idle-timeout still bounds the wait.
  void wait_for_body_budget() {
    if (!budget_waited_) {
      budget_waited_ = true;
      svc_.metrics.body_budget_wait();
    }
    if (!budget_timer_) budget_timer_.emplace(stream_.get_executor());
    budget_timer_->expires_after(std::chrono::milliseconds(20));
    budget_timer_->async_wait([self = shared_from_this()](beast::error_code ec) {
      if (!ec && self->reading_ && self->stream_.socket().is_open()) self->read_request();
    });
  }

  void on_client_bytes(beast::error_code ec, std::size_t n) {
    buffer_.commit(n);
    if (ec) return on_read(ec, 0);
    read_request();
  }

  // --client-idle-timeout (a LazyDeadline: a request costs a clock read, not a timer operation) has passed:
  // a read still under way closes the connection, and the pending read then fails and ends the session.
  void on_idle() {
    if (stream_.socket().is_open() && reading_) do_close();
  }

  void on_read(beast::error_code ec, std::size_t) {
    reading_ = false;
    if (ec == http::error::end_of_stream || ec == asio::error::operation_aborted || ec == beast::error::timeout ||
        ec == asio::error::connection_reset || ec == asio::error::eof) {
      return do_close();
    }
    if (ec == http::error::body_limit) {
      close_after_ = true;
      return send_error(make_error("request body exceeds the limit of " + std::to_string(svc_.config.max_body_bytes) +
                                       " bytes",
                                   413, "invalid_request_error", "body_too_large"));
    }
    if (ec == http::error::header_limit) {
      close_after_ = true;
      return send_error(make_error("request headers exceed 65536 bytes", 431, "invalid_request_error", "headers_too_large"));
    }
    if (ec) {
      close_after_ = true;
      return send_error(make_error("malformed HTTP request: " + ec.message(), 400, "invalid_request_error", "bad_http"));
    }
    req_ = parser_->release();
    close_after_ = !req_.keep_alive() || drain_->draining;
    if (kind_ == Listener::Kind::kApi) {
      counted_ = true;
      ++drain_->active;
      if (access_log_) {
        access_ = AccessRecord{};
        access_.at = std::chrono::system_clock::now();
        access_.start = std::chrono::steady_clock::now();
        worker_.reset();
      }
    }
    request_id_ = std::string(req_["x-request-id"]);
    if (request_id_.empty() || request_id_.size() > 200) request_id_ = new_request_id();
    status_ = 0;  // the worker's status for this request, once its answer's head arrives
    end_background_watch();
    if (kind_ == Listener::Kind::kAdmin) return handle_admin();
    handle_api();
  }

  // ---- API routes ----
  void handle_api() {
    std::string_view target = req_.target();
    std::string_view path = target.substr(0, target.find('?'));
    const auto method = req_.method();
    if (path == "/health") {
      if (method != http::verb::get && method != http::verb::head) return method_not_allowed("GET");
      return send_json(200, R"({"status":"ok"})");
    }
    if (path == "/ready") {
      if (method != http::verb::get && method != http::verb::head) return method_not_allowed("GET");
      if (drain_->draining) return send_error(make_error("shutting down", 503, "service_unavailable", "draining"));
      if (svc_.router.any_healthy()) return send_json(200, R"({"status":"ready"})");
      return send_error(make_error("no healthy worker", 503, "service_unavailable", "no_healthy_worker"));
    }
    if (path == "/v1/chat/completions" || path == "/v1/completions" || path == "/v1/responses") {
      if (method != http::verb::post) return method_not_allowed("POST");
      return handle_routed(path == "/v1/chat/completions" ? Endpoint::kChatCompletions
                           : path == "/v1/completions"    ? Endpoint::kCompletions
                                                          : Endpoint::kResponses);
    }
    if (path == "/v1/models") {
      if (method != http::verb::get) return method_not_allowed("GET");
      return handle_models();
    }
    if (path == "/v1/load_lora_adapter" || path == "/v1/unload_lora_adapter") {
      if (method != http::verb::post) return method_not_allowed("POST");
      return handle_lora_update(std::string(path));
    }
    if (path.starts_with("/v1/") || passed_through_root_route(path)) {
      decision_.reset();
      reroutes_ = 0;
      strip_usage_ = false;
      up_body_.clear();
      passthrough_model_ = top_level_model(req_.body());
      // A stored response (GET, DELETE, cancel, input_items) lives on the worker that made it.
      if (path.starts_with("/v1/responses/")) {
        const std::string_view rest = path.substr(std::string_view("/v1/responses/").size());
        std::string id(rest.substr(0, rest.find('/')));
        watch_background(id, rest.substr(id.size()), method);
        if (const auto owner = svc_.router.response_owner(id)) return forward_to_owner(*owner);
        return find_response_owner(id, [self = shared_from_this(), id] { self->forward_to_response_owner(id); });
      }
      return forward_to_least_loaded();
    }
    send_error(make_error("no route for " + std::string(req_.method_string()) + " " + std::string(path), 404,
                          "invalid_request_error", "unknown_route"));
  }

  bool want_tokenize() const {
    if (svc_.config.tokenize == "always") return true;
    if (svc_.config.tokenize == "never") return false;
    const auto workers = svc_.registry.snapshot();
    for (const auto& w : *workers) {
      if (w->precise()) return true;
    }
    return false;
  }

  void handle_routed(Endpoint endpoint) {
    const auto t0 = std::chrono::steady_clock::now();
    // The router reads the body to route it, and OpenAI servers take JSON as it is: a compressed body gets a
    // clear refusal, not a JSON syntax error.
    if (const std::string_view coding = req_[http::field::content_encoding];
        !coding.empty() && !beast::iequals(coding, "identity")) {
      svc_.metrics.error("bad_request");
      return send_error(make_error("request bodies with Content-Encoding '" + std::string(coding) +
                                       "' are not supported: send the JSON uncompressed",
                                   415, "invalid_request_error", "unsupported_content_encoding"));
    }
    RequestHeaders headers{req_[svc_.config.session_header], req_[svc_.config.tenant_header],
                           req_[svc_.config.priority_header]};
    auto parsed = parse_request(endpoint, req_.body(), headers,
                                ParseOptions{svc_.config.block_tokens, svc_.config.block_bytes, want_tokenize()});
    if (!parsed) {
      svc_.metrics.error("bad_request");
      return send_error(parsed.error());
    }
    const std::string& previous = parsed->previous_response_id;
    if (!previous.empty() && !svc_.router.response_owner(previous)) {
      auto request = std::make_shared<RoutableRequest>(std::move(*parsed));
      return find_response_owner(request->previous_response_id, [self = shared_from_this(), request, t0] {
        self->prepare_route(std::move(*request), t0);
      });
    }
    prepare_route(std::move(*parsed), t0);
  }

  // Where a Responses API id this router did not see being made is stored: another router replica (the chart
  // runs two) or this one before a restart routed it. Every healthy worker is asked (GET /v1/responses/ID; a
  // worker that does not store it answers 404), the one that has it is remembered, then `then` runs. Ids that
  // could not be a path segment are not looked up, nor any while kMaxResponseLookups are under way.
  void find_response_owner(const std::string& id, std::function<void()> then) {
    const bool plausible = !id.empty() && id.size() <= 256 && std::all_of(id.begin(), id.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
    });
    struct Lookup {
      std::size_t pending = 0;
      bool done = false;
      std::function<void()> then;
    };
    auto lookup = std::make_shared<Lookup>();
    lookup->then = std::move(then);
    std::vector<std::shared_ptr<backends::Worker>> asked;
    if (plausible) asked = healthy_workers(svc_.registry);
    lookup->pending = asked.size();
    if (lookup->pending == 0) return lookup->then();
    if (response_lookups_in_flight.fetch_add(1) >= kMaxResponseLookups) {
      --response_lookups_in_flight;
      svc_.metrics.response_lookup("skipped");
      return lookup->then();
    }
    const auto timeout = std::chrono::milliseconds(static_cast<long long>(svc_.config.health_timeout_s * 1000));
    // Asked with the client's own credentials (workers with an API key refuse /v1 routes without them): a
    // client that could not read the response from its worker cannot have it found either.
    const std::string authorization(req_[http::field::authorization]);
    for (const auto& w : asked) {
      backends::http_get(
          stream_.get_executor(), w->endpoint(), "/v1/responses/" + id, timeout,
          [self = shared_from_this(), lookup, w, id](Result<backends::SimpleResponse> r) {
            asio::post(self->stream_.get_executor(), [self, lookup, w, id, found = r && r->status == 200] {
              --lookup->pending;
              if (lookup->pending == 0) --response_lookups_in_flight;
              if (lookup->done || (!found && lookup->pending > 0)) return;
              lookup->done = true;
              if (found) self->svc_.router.remember_response(id, w->id());
              self->svc_.metrics.response_lookup(found ? "found" : "not_found");
              LOG_DEBUG("request " << self->request_id_ << ": response " << id
                                   << (found ? " is stored on worker " + w->name() : std::string(" is on no worker")));
              lookup->then();
            });
          },
          /*body_limit=*/64u << 20, authorization);
    }
  }

  // Tokenizes the prompt when the chain should be over the workers' token ids, then routes.
  void prepare_route(RoutableRequest parsed, std::chrono::steady_clock::time_point t0) {
    if (!parsed.tokenize_body.empty()) {
      if (TokenIds cached = svc_.tokenize_cache.get(parsed.tokenize_key)) {
        use_token_ids(parsed, *cached, svc_.config.block_tokens);
        svc_.metrics.tokenized("cache_hit", 0.0);
        return route_parsed(std::move(parsed), t0);
      }
      auto worker = svc_.router.any_healthy(parsed.model);  // the model's tokenizer
      if (worker) {
        auto request = std::make_shared<RoutableRequest>(std::move(parsed));
        const std::string body = request->tokenize_body;
        const auto timeout = std::chrono::milliseconds(static_cast<long long>(svc_.config.tokenize_timeout_s * 1000));
        backends::http_post(stream_.get_executor(), worker->endpoint(), "/tokenize", body, timeout,
                            [self = shared_from_this(), request, t0](Result<backends::SimpleResponse> r) {
                              asio::post(self->stream_.get_executor(), [self, request, t0, r = std::move(r)]() mutable {
                                self->on_tokenized(std::move(*request), t0, std::move(r));
                              });
                            },
                            16u << 20, svc_.config.worker_authorization());
        return;
      }
    }
    route_parsed(std::move(parsed), t0);
  }

  void on_tokenized(RoutableRequest request, std::chrono::steady_clock::time_point t0,
                    Result<backends::SimpleResponse> r) {
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::optional<std::vector<std::uint32_t>> tokens;
    std::string why;
    if (!r) {
      why = r.error().message;
    } else if (r->status != 200) {
      why = "/tokenize answered " + std::to_string(r->status);
    } else if (auto parsed = parse_tokenize_response(r->body); !parsed) {
      why = parsed.error().message;
    } else {
      tokens = std::move(*parsed);
    }
    if (tokens) {
      auto shared = std::make_shared<const std::vector<std::uint32_t>>(std::move(*tokens));
      use_token_ids(request, *shared, svc_.config.block_tokens);
      svc_.tokenize_cache.put(request.tokenize_key, std::move(shared));
      svc_.metrics.tokenized("tokenized", took);
    } else {
      // The text chain stays: routing goes on, only less precisely.
      LOG_DEBUG("request " << request_id_ << ": tokenization failed (" << why << "); routing on the text");
      svc_.metrics.tokenized("fallback", took);
    }
    route_parsed(std::move(request), t0);
  }

  void route_parsed(RoutableRequest parsed, std::chrono::steady_clock::time_point t0) {
    reroutes_ = 0;
    auto decision = svc_.router.route(parsed);
    if (!decision) return send_error(decision.error());
    decision_ = std::move(*decision);
    decision_->start = t0;
    strip_usage_ = parsed.strip_usage;
    up_body_ = std::move(parsed.upstream_body);
    routable_ = std::move(parsed);  // kept to route again if the worker cannot be reached
    note_decision();
    LOG_DEBUG("request " << request_id_ << " -> " << decision_->worker->name() << " ("
              << policy::reason_name(decision_->pick.reason) << ", predicted cached "
              << decision_->pick.predicted_cached_tokens << "/" << decision_->prompt_tokens << ")"
              << (decision_->hold_leader ? ", held for its prefix" : ""));
    if (decision_->hold_leader) return wait_for_prefix();
    forward(decision_->worker);
  }

  // kv_cost's prefix hold (Router::prefix_held): the worker is still computing this request's prefix for an
  // earlier one. The router wakes it when that request has its first byte or the worker's event stores the
  // prefix (Router::watch_prefix_hold); it also checks every kPrefixHoldRecheck (for a block that left the
  // index) and at --prefix-hold, then the request goes. Every wake-up or check carries the hold's sequence
  // number, so only the latest counts.
  void wait_for_prefix() {
    const std::uint64_t seq = ++hold_seq_;
    svc_.router.unwatch_prefix_hold(std::exchange(hold_watch_, 0));
    // Watched before checking, so that a first byte or event between the check and the watch is not missed.
    hold_watch_ = svc_.router.watch_prefix_hold(
        *decision_, [weak = weak_from_this(), seq, ex = stream_.get_executor()] {
          asio::post(ex, [weak, seq] {
            if (auto self = weak.lock()) self->on_hold_wake(seq);
          });
        });
    if (!svc_.router.prefix_held(*decision_)) {
      end_hold();
      return forward(decision_->worker);
    }
    // A client that leaves meanwhile: its request is never sent (client_gone()).
    if (watched_ != generation_) {
      watched_ = generation_;
      watch_client();
    }
    if (!hold_timer_) hold_timer_.emplace(stream_.get_executor());
    const auto left = decision_->hold_until - std::chrono::steady_clock::now();
    hold_timer_->expires_after(std::min<std::chrono::steady_clock::duration>(kPrefixHoldRecheck, left));
    hold_timer_->async_wait([self = shared_from_this(), seq](beast::error_code ec) {
      if (!ec) self->on_hold_wake(seq);
    });
  }

  void on_hold_wake(std::uint64_t seq) {
    if (seq != hold_seq_ || !held_for_prefix()) return;
    wait_for_prefix();
  }

  // The hold is over (the request goes, or its client left): later wake-ups and checks find nothing to do.
  void end_hold() {
    ++hold_seq_;
    svc_.router.unwatch_prefix_hold(std::exchange(hold_watch_, 0));
    svc_.router.prefix_hold_ended(*decision_);
  }

  bool held_for_prefix() const { return decision_ && decision_->hold_leader != 0; }

  // ---- proxying ----
  void forward(std::shared_ptr<backends::Worker> worker) {
    worker_ = std::move(worker);
    // Nothing of an earlier exchange on this connection may be read as this one's usage (finish() reads it
    // even when the exchange ends before the worker's head).
    tail_.clear();
    stream_usage_.reset();
    // HTTP/1.1 to the worker: keep-alive by default, the body re-framed by its length.
    const std::string& body = up_body_.empty() ? req_.body() : up_body_;
    up_head_.clear();
    up_head_.append(req_.method_string());
    up_head_.push_back(' ');
    up_head_.append(req_.target());
    up_head_.append(" HTTP/1.1\r\n");
    for (const auto& f : req_) {
      if (!hop_by_hop(f.name(), f.name_string()) && !beast::iequals(f.name_string(), "x-request-id")) {
        append_field(up_head_, f.name_string(), f.value());
      }
    }
    append_field(up_head_, "Host", worker_->endpoint().name);
    append_field(up_head_, "x-request-id", request_id_);
    append_field(up_head_, "Content-Length", std::to_string(body.size()));
    up_head_.append("\r\n");
    up_body_view_ = body;
    acquire(false);
  }

  void acquire(bool fresh_only) {
    svc_.pool.acquire(
        *worker_,
        [self = shared_from_this()](beast::error_code ec, backends::UpstreamPool::Lease l) {
          // An idle pooled connection is handed over inline (same thread): dispatch runs it at once.
          asio::dispatch(self->stream_.get_executor(),
                         [self, ec, l = std::move(l)]() mutable { self->on_connect(ec, std::move(l)); });
        },
        fresh_only);
  }

  void on_connect(beast::error_code ec, backends::UpstreamPool::Lease lease) {
    if (ec) return connect_failed(ec);
    lease_ = std::move(lease);
    // The exchange runs on the plain sockets (tcp_stream arms its timer on every operation): --request-timeout
    // holds for the whole exchange, from here to the end of the relayed body.
    awaiting_head_ = true;
    const auto now = std::chrono::steady_clock::now();
    deadline_.set(now + seconds(svc_.config.request_timeout_s), weak_from_this());
    watch_.set(now + kWatchClientAfter, weak_from_this());
    Pieces out;
    out.add(up_head_.data(), up_head_.size());
    out.add(up_body_view_.data(), up_body_view_.size());
    asio::async_write(lease_.stream->socket(), out,
                      asio::bind_executor(stream_.get_executor(),
                                          beast::bind_front_handler(&ApiSession::on_upstream_write, shared_from_this())));
  }

  // The exchange's handlers return at once when client_gone() ended it (no lease) while their operation was
  // already queued.
  void on_upstream_write(beast::error_code ec, std::size_t) {
    if (!lease_.stream) return;
    if (ec) return upstream_failed("sending to worker " + worker_->name() + ": " + ec.message(), lease_.reused);
    up_buffer_.clear();
    new_upstream_parser();
    read_upstream_head();
  }

  void new_upstream_parser() {
    up_parser_.emplace();
    up_parser_->body_limit(boost::none);
    up_parser_->header_limit(kHeaderLimit);
  }

  // Reads until the worker's head is complete; body bytes that came with it stay in up_buffer_.
  void read_upstream_head() {
    beast::error_code ec;
    if (up_buffer_.size() > 0) {
      const std::size_t n = up_parser_->put(up_buffer_.data(), ec);
      up_buffer_.consume(n);
      if (ec == http::error::need_more) ec = {};
    }
    if (ec) return upstream_failed("reading from worker " + worker_->name() + ": " + ec.message(), false);
    if (up_parser_->is_header_done()) {
      // An interim response (100 Continue, 103 Early Hints) precedes the real one: skip it.
      const unsigned status = up_parser_->get().result_int();
      if (status >= 100 && status < 200 && status != 101) {
        new_upstream_parser();
        return read_upstream_head();
      }
      return on_upstream_header();
    }
    lease_.stream->socket().async_read_some(
        up_buffer_.prepare(kRelayChunk),
        asio::bind_executor(stream_.get_executor(),
                            beast::bind_front_handler(&ApiSession::on_upstream_head_bytes, shared_from_this())));
  }

  void on_upstream_head_bytes(beast::error_code ec, std::size_t n) {
    if (!lease_.stream) return;
    up_buffer_.commit(n);
    // A reused keep-alive connection the worker closed while idle ends at once: retried once, fresh.
    if (ec) return upstream_failed("reading from worker " + worker_->name() + ": " + ec.message(), lease_.reused);
    read_upstream_head();
  }

  void on_upstream_header() {
    awaiting_head_ = false;
    auto& up = up_parser_->get();
    status_ = up.result_int();
    access_.status = status_;
    down_head_.clear();
    down_head_.append("HTTP/1.1 ");
    down_head_.append(std::to_string(status_));
    down_head_.push_back(' ');
    down_head_.append(up.reason().empty() ? http::obsolete_reason(up.result()) : up.reason());
    down_head_.append("\r\n");
    for (const auto& f : up) {
      const std::string_view name = f.name_string();
      if (hop_by_hop(f.name(), name) || f.name() == http::field::server || beast::iequals(name, "x-request-id") ||
          beast::iequals(name, "x-kvroute-worker")) {
        continue;
      }
      append_field(down_head_, name, f.value());
    }
    append_field(down_head_, "Server", "kvroute");
    if (!request_id_.empty()) append_field(down_head_, "x-request-id", request_id_);
    if (svc_.config.worker_header) append_field(down_head_, "x-kvroute-worker", worker_->name());
    const bool event_stream = up[http::field::content_type].find("text/event-stream") != std::string_view::npos;
    strip_active_ = strip_usage_ && event_stream;
    // A new stored response: its id is read from the body's first bytes, to send its continuations here.
    id_head_.clear();
    capture_id_ = routable_ && routable_->endpoint == Endpoint::kResponses && status_ == 200;
    id_in_events_ = event_stream;
    await_output_ = capture_id_ && event_stream;
    sse_.clear();
    down_chunked_ = false;
    if (strip_active_) {
      down_chunked_ = true;  // the body shrinks by the removed event
    } else if (auto len = up_parser_->content_length()) {
      append_field(down_head_, "Content-Length", std::to_string(*len));
    } else if (up_parser_->is_done() || status_ == 204 || status_ == 304) {
      append_field(down_head_, "Content-Length", "0");
    } else {
      down_chunked_ = true;
    }
    if (down_chunked_ && req_.version() < 11) {
      // An HTTP/1.0 client knows no chunked coding (RFC 9112 section 6.1): the body ends where the connection
      // does.
      down_chunked_ = false;
      close_after_ = true;
    }
    if (down_chunked_) append_field(down_head_, "Transfer-Encoding", "chunked");
    if (close_after_) append_field(down_head_, "Connection", "close");
    down_head_.append("\r\n");
    head_pending_ = true;
    down_last_ = false;
    // Eager: one read passes on every chunk it brought (an SSE stream is a chunk per event), not one chunk.
    up_parser_->eager(true);
    // Body bytes that came with the head go out with it in one write; otherwise the head goes out alone now.
    if (up_buffer_.size() > 0 || up_parser_->is_done()) {
      beast::error_code perr;
      const std::size_t got = parse_buffered(perr);
      if (perr) return upstream_failed("reading from worker " + worker_->name() + ": " + perr.message(), false);
      if (got > 0 || up_parser_->is_done()) return relay_piece(got, up_parser_->is_done());
    }
    write_down(nullptr, 0, false);
  }

  // Parses body bytes already in up_buffer_ into relay_ without touching the socket; returns how many it
  // produced. A chunk header cut in two (need_more) or a full relay_ (need_buffer) just ends the pass.
  std::size_t parse_buffered(beast::error_code& ec) {
    auto& body = up_parser_->get().body();
    body.data = relay_.data();
    body.size = relay_.size();
    while (up_buffer_.size() > 0 && body.size > 0 && !up_parser_->is_done()) {
      const std::size_t n = up_parser_->put(up_buffer_.data(), ec);
      up_buffer_.consume(n);
      if (ec == http::error::need_more || ec == http::error::need_buffer) {
        ec = {};
        break;
      }
      if (ec || n == 0) break;
    }
    return relay_.size() - body.size;
  }

  void read_upstream_body() {
    if (up_parser_->is_done()) return relay_piece(0, true);
    beast::error_code perr;
    const std::size_t got = parse_buffered(perr);
    if (perr) return upstream_broke_off(perr);
    if (got > 0 || up_parser_->is_done()) return relay_piece(got, up_parser_->is_done());
    // Plain socket reads, parsed here: Beast's read_some on an eager parser goes back to the socket whenever
    // the input ends at a chunk boundary (need_more), so each SSE event waited for the next, and a stream
    // reached the client only in 16 KB pieces or at its end.
    lease_.stream->socket().async_read_some(
        up_buffer_.prepare(kRelayChunk),
        asio::bind_executor(stream_.get_executor(),
                            beast::bind_front_handler(&ApiSession::on_upstream_bytes, shared_from_this())));
  }

  void on_upstream_bytes(beast::error_code ec, std::size_t n) {
    if (!lease_.stream) return;
    up_buffer_.commit(n);
    if (ec == asio::error::eof) {
      // A body delimited by the end of the connection (no length, not chunked) is complete now; any other is cut.
      up_parser_->put_eof(ec);
      if (!ec && up_parser_->is_done()) return relay_piece(0, true);
    }
    if (ec) return upstream_broke_off(ec);
    read_upstream_body();
  }

  // The exchange outlived --request-timeout (a LazyDeadline: an exchange costs a clock read, not a timer
  // operation). Before the worker's head the client gets a 504; after it, the head is already out and both
  // connections close. Either way the worker sees its connection close and cancels the request.
  void on_deadline() {
    if (!lease_.stream) return;  // no exchange under way
    orphan_ = lease_.stream;  // outlives the upstream operation still completing after the close
    beast::error_code ignored;
    lease_.stream->socket().shutdown(tcp::socket::shutdown_both, ignored);
    lease_.stream->socket().close(ignored);
    if (awaiting_head_) {
      return upstream_failed("worker " + worker_->name() + " did not answer within --request-timeout (" +
                                 fmt_seconds(svc_.config.request_timeout_s) + ")",
                             false, 504, "worker_timeout");
    }
    upstream_broke_off(beast::error::timeout);
  }

  // The head is already out: the client can only learn of the failure by the connection closing.
  void upstream_broke_off(beast::error_code ec) {
    LOG_WARN("request " << request_id_ << ": worker " << worker_->name() << " broke off the response: " << ec.message());
    close_after_ = true;
    finish(false, false);
    do_close();
  }

  void relay_piece(std::size_t got, bool last) {
    const char* data = relay_.data();
    std::size_t size = got;
    if (got > 0) {
      const std::string_view piece(relay_.data(), got);
      // A Responses API stream opens with events sent before the prompt is computed: its first token is the
      // first event after them.
      if (decision_ && (!await_output_ || responses_output_began(piece))) {
        await_output_ = false;
        svc_.router.first_byte(*decision_);
      }
      keep_tail(piece);
      if (capture_id_) capture_response_id(piece);
      if (status_reader_) status_reader_->feed(piece);
    }
    if (strip_active_) {
      sse_.append(relay_.data(), got);
      out_.clear();
      take_complete_events(sse_, out_, last, stream_usage_);
      data = out_.data();
      size = out_.size();
    }
    if (size == 0 && !last) return read_upstream_body();
    // A background response's "queued" answer, complete: held before the client can act on its id.
    if (last && decision_ && decision_->background && status_ >= 200 && status_ < 300) svc_.router.hold_answered(*decision_);
    write_down(data, size, last);
  }

  // Sends the next piece of the response to the client: the head if it has not gone out yet, then `size`
  // bytes of body, chunk-framed for a chunked response (plus the last chunk when `last`).
  void write_down(const char* data, std::size_t size, bool last) {
    Pieces out;
    if (head_pending_) {
      out.add(down_head_.data(), down_head_.size());
      head_pending_ = false;
    }
    if (down_chunked_) {
      if (size > 0) {
        const int n = std::snprintf(chunk_line_.data(), chunk_line_.size(), "%zx\r\n", size);
        out.add(chunk_line_.data(), static_cast<std::size_t>(n));
        out.add(data, size);
        out.add("\r\n", 2);
      }
      if (last) out.add("0\r\n\r\n", 5);
    } else {
      out.add(data, size);
    }
    down_last_ = last;
    asio::async_write(stream_.socket(), out,
                      beast::bind_front_handler(&ApiSession::on_down_written, shared_from_this()));
  }

  void on_down_written(beast::error_code ec, std::size_t) {
    if (!lease_.stream) return;
    if (ec) {
      // The client went away: drop the upstream connection so the worker cancels the request.
      client_gone();
      return;
    }
    if (!down_last_) return read_upstream_body();
    finish(status_ >= 200 && status_ < 300, up_parser_->keep_alive());
    if (close_after_ || drain_->draining) return do_close();
    do_read();
  }

  // A poll, cancel or delete of a background response whose load the router holds: its answer may show that the
  // response has ended (Router::holds_background).
  void watch_background(const std::string& id, std::string_view suffix, http::verb method) {
    if (!svc_.router.holds_background(id)) return;
    if (suffix.empty() && method == http::verb::get) {
      background_watch_ = BackgroundWatch::kPoll;
      status_reader_ = std::make_unique<ResponseStatusReader>();
    } else if ((suffix.empty() && method == http::verb::delete_) || (suffix == "/cancel" && method == http::verb::post)) {
      background_watch_ = BackgroundWatch::kEnd;
    } else {
      return;
    }
    background_id_ = id;
  }

  // The exchange watched by watch_background() is over: a 2xx cancel or delete ends the response, and so does a
  // poll answered with a final status, or a 404 (the worker no longer has it: restarted, or it was deleted).
  void settle_background(bool ok) {
    if (background_watch_ == BackgroundWatch::kNone) return;
    bool ended = false;
    if (background_watch_ == BackgroundWatch::kEnd) {
      ended = ok;
    } else if (status_ == 404) {
      ended = true;
    } else if (ok && status_reader_) {
      const auto status = status_reader_->finish();
      ended = status && final_response_status(*status);
    }
    if (ended) svc_.router.background_ended(background_id_);
    end_background_watch();
  }

  void end_background_watch() {
    background_watch_ = BackgroundWatch::kNone;
    background_id_.clear();
    status_reader_.reset();
  }

  void capture_response_id(std::string_view piece) {
    id_head_.append(piece);
    if (auto id = response_id(id_head_, id_in_events_)) {
      if (decision_ && decision_->background) decision_->response_id = *id;
      svc_.router.remember_response(std::move(*id), worker_->id());
      capture_id_ = false;
    } else if (id_head_.size() > kResponseIdHead) {
      LOG_WARN("request " << request_id_ << ": no response id in the first " << kResponseIdHead << " bytes from worker "
                          << worker_->name() << "; a continuation of this response may not reach it");
      capture_id_ = false;
    }
  }

  void keep_tail(std::string_view piece) {
    tail_.append(piece);
    if (tail_.size() > 2 * kUsageTail) tail_.erase(0, tail_.size() - kUsageTail);
  }

  // Ends the exchange once: releases the upstream connection and tells the router how it went.
  void finish(bool ok, bool reusable, bool worker_failed = true) {
    ++generation_;
    settle_background(ok);
    beast::error_code ignored;
    if (lease_.stream) {
      lease_.stream->expires_never();
      svc_.pool.release(std::move(lease_), reusable);
    }
    lease_ = {};
    if (decision_) {
      Outcome o;
      o.ok = ok;
      o.worker_failed = worker_failed;
      // The usage event the relay removed; else the response's end (a worker may put usage in its last
      // token event instead).
      o.usage = stream_usage_ ? stream_usage_ : find_usage(tail_);
      if (decision_->first_byte_seen && !decision_->background) access_.ttft_s = decision_->ttft_s;
      access_.usage = o.usage;
      svc_.router.complete(*decision_, o);
      decision_.reset();
      routable_.reset();  // its chain is not kept for as long as the connection idles
    }
    // up_parser_ and the heads stay until the next exchange replaces them: after client_gone() an operation
    // that was already under way may still complete into them.
  }

  // Nothing was sent, so the request can go elsewhere: a worker that refuses connections (or does not answer
  // them within --connect-timeout) is taken out of rotation at once, without waiting for its health checks,
  // and the request is routed again, up to kMaxReroutes times. Out of descriptors here, no worker is to blame.
  void connect_failed(beast::error_code ec) {
    const std::string reason = ec == beast::error::timeout ? std::string("timed out") : ec.message();
    const std::string why = "cannot connect to worker " + worker_->name() + ": " + reason;
    if (net::local_resource_error(ec)) return upstream_failed(why, false, 503, "router_overloaded");
    svc_.worker_unreachable(*worker_, "could not be connected to (" + reason + ")");
    if (reroutes_ >= kMaxReroutes) return upstream_failed(why, false);
    ++reroutes_;
    LOG_INFO("request " << request_id_ << ": " << why << "; routing it again");
    if (!decision_) return forward_to_least_loaded();
    const auto t0 = decision_->start;
    svc_.router.complete(*decision_, Outcome{false, std::nullopt, /*worker_failed=*/false});
    decision_.reset();
    auto again = svc_.router.route(*routable_);
    if (!again) return send_error(again.error());
    decision_ = std::move(*again);
    decision_->start = t0;
    note_decision();
    forward(decision_->worker);
  }

  void forward_to_response_owner(const std::string& id) {
    if (const auto owner = svc_.router.response_owner(id)) return forward_to_owner(*owner);
    forward_to_least_loaded();
  }

  // To the worker that stores a response; when it is gone or unhealthy, as any passed-through route (the
  // worker that gets it answers that it has no such response).
  void forward_to_owner(hashing::WorkerId owner) {
    if (auto worker = svc_.registry.find(owner); worker && worker->healthy()) return forward(std::move(worker));
    forward_to_least_loaded();
  }

  // A route passed through as it is (no prefix routing): to the least loaded healthy worker.
  void forward_to_least_loaded() {
    auto worker = svc_.router.any_healthy(passthrough_model_);
    if (!worker) return send_error(no_healthy_worker());
    forward(std::move(worker));
  }

  void upstream_failed(const std::string& why, bool retry_fresh, unsigned status = 502,
                       const char* code = "worker_unavailable") {
    if (lease_.stream) {
      svc_.pool.release(std::move(lease_), false);
      lease_ = {};
    }
    // A reused keep-alive connection may have been closed by the worker while idle: retry once, fresh.
    if (retry_fresh && !retried_) {
      retried_ = true;
      return acquire(true);
    }
    retried_ = false;
    LOG_WARN("request " << request_id_ << ": " << why);
    if (decision_) {
      svc_.router.complete(*decision_, Outcome{false, std::nullopt});
      decision_.reset();
      routable_.reset();
    }
    ++generation_;
    send_error(make_error(why, status, "upstream_error", code));
  }

  // The exchange under way has run kWatchClientAfter: its client is watched from now on, once.
  void on_watch_due() {
    if (!lease_.stream || watched_ == generation_) return;
    watched_ = generation_;
    watch_client();
  }

  // Notices a client that disconnects while the worker is still thinking (no write in progress to fail), or while
  // its request is held for its prefix.
  void watch_client() {
    const std::uint64_t gen = generation_;
    stream_.socket().async_wait(tcp::socket::wait_read,
                                beast::bind_front_handler(&ApiSession::on_client_readable, shared_from_this(), gen));
  }

  void on_client_readable(std::uint64_t gen, beast::error_code ec) {
    if (ec || gen != generation_) return;
    if (!lease_.stream && !held_for_prefix()) {
      // Readable between a hold's end and the connection to the worker: the exchange watches again once it
      // runs (on_watch_due).
      watched_ = ~std::uint64_t{0};
      return;
    }
    beast::error_code e2;
    if (stream_.socket().available(e2) > 0) return;  // a pipelined request, not a disconnect
    char byte;  // MSG_DONTWAIT rather than toggling the socket's mode: one system call, not three
    const ssize_t n = ::recv(stream_.socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return watch_client();  // spurious
    if (n > 0) return;                                                // data arrived meanwhile: pipelining
    client_gone();                                                    // end of stream or a reset
  }

  void client_gone() {
    const bool held = held_for_prefix();
    if (held) end_hold();  // never sent
    if (lease_.stream) {
      orphan_ = lease_.stream;  // outlives an upstream operation still completing after the close
      beast::error_code ignored;
      lease_.stream->socket().shutdown(tcp::socket::shutdown_both, ignored);
      lease_.stream->socket().close(ignored);
    }
    LOG_DEBUG("request " << request_id_ << ": client disconnected; "
              << (held ? "its request, held for its prefix, is not sent" : "upstream request cancelled"));
    access_.client_gone = true;
    svc_.metrics.error("client_disconnected");
    finish(false, false, /*worker_failed=*/false);
    do_close();
  }

  // ---- /v1/models ----
  void handle_models() {
    const auto workers = healthy_workers(svc_.registry);
    if (workers.empty()) return send_error(no_healthy_worker());
    auto state = std::make_shared<ModelsFanout>();
    state->pending = static_cast<int>(workers.size());
    // With the client's credentials: workers with an API key list their models only to clients that have it.
    const std::string authorization(req_[http::field::authorization]);
    for (const auto& w : workers) {
      backends::http_get(stream_.get_executor(), w->endpoint(), "/v1/models", std::chrono::seconds(5),
                         [self = shared_from_this(), state](Result<backends::SimpleResponse> r) {
                           asio::post(self->stream_.get_executor(), [self, state, r = std::move(r)]() mutable {
                             self->on_models_reply(state, std::move(r));
                           });
                         },
                         4u << 20, authorization);
    }
  }

  // ---- /v1/load_lora_adapter, /v1/unload_lora_adapter ----
  // An adapter is loaded on (or unloaded from) the fleet, not one worker: the request goes to every healthy
  // worker, with the client's credentials, and each one that answers has its /v1/models read again before
  // the answer, so requests naming the adapter go to the workers that have it from the next request on (not
  // from the next 30 s refresh). When every worker accepted it, or every one refused it, the answer is the
  // first worker's; when only some refused, it is the first refusal's status, with what each one answered.
  void handle_lora_update(std::string path) {
    auto state = std::make_shared<LoraFanout>();
    state->asked = healthy_workers(svc_.registry);
    // x-kvroute-workers: NAME[,NAME...] places (or removes) the adapter on those workers only, by the names
    // /admin/workers shows (or their URLs).
    if (const std::string_view only = req_["x-kvroute-workers"]; !only.empty()) {
      auto chosen = chosen_workers(only);
      if (!chosen) return send_error(chosen.error());
      std::erase_if(state->asked, [&](const auto& w) { return !chosen->contains(w->id()); });
    }
    if (state->asked.empty()) return send_error(no_healthy_worker());
    state->replies.resize(state->asked.size());
    state->pending = state->asked.size();
    const std::string authorization(req_[http::field::authorization]);
    const auto timeout = std::chrono::milliseconds(static_cast<long long>(svc_.config.request_timeout_s * 1000));
    for (std::size_t i = 0; i < state->asked.size(); ++i) {
      backends::http_post(stream_.get_executor(), state->asked[i]->endpoint(), path, req_.body(), timeout,
                          [self = shared_from_this(), state, i](Result<backends::SimpleResponse> r) {
                            asio::post(self->stream_.get_executor(), [self, state, i, r = std::move(r)]() mutable {
                              self->on_lora_reply(state, i, std::move(r));
                            });
                          },
                          64u << 10, authorization);
    }
  }

  // The workers a comma-separated list names; an error naming what matches no worker.
  Result<std::set<hashing::WorkerId>> chosen_workers(std::string_view list) const {
    std::set<hashing::WorkerId> out;
    const auto workers = svc_.registry.snapshot();
    for (std::string_view name : split(list, ',')) {
      while (!name.empty() && name.front() == ' ') name.remove_prefix(1);
      while (!name.empty() && name.back() == ' ') name.remove_suffix(1);
      if (name.empty()) continue;
      bool found = false;
      for (const auto& w : *workers) {
        if (w->name() == name || w->endpoint().url == name) {
          out.insert(w->id());
          found = true;
        }
      }
      if (!found) {
        std::string known;
        for (const auto& w : *workers) known += (known.empty() ? "" : ", ") + w->name();
        return make_error("x-kvroute-workers names no worker called '" + std::string(name) + "' (workers: " + known + ")",
                          400, "invalid_request_error", "unknown_worker");
      }
    }
    if (out.empty()) return make_error("x-kvroute-workers names no worker", 400, "invalid_request_error", "unknown_worker");
    return out;
  }

  struct LoraFanout {
    std::vector<std::shared_ptr<backends::Worker>> asked;
    std::vector<std::optional<Result<backends::SimpleResponse>>> replies;  // set as the workers answer
    std::size_t pending = 0;  // replies and /v1/models re-reads still to come
  };

  void on_lora_reply(std::shared_ptr<LoraFanout> st, std::size_t i, Result<backends::SimpleResponse> r) {
    // Any worker that answered is read again: one that refused may still have changed (or had the adapter).
    const bool answered = static_cast<bool>(r);
    st->replies[i] = std::move(r);
    if (answered && svc_.refresh_models) {
      ++st->pending;
      svc_.refresh_models(st->asked[i]->id(), [self = shared_from_this(), st] {
        asio::post(self->stream_.get_executor(), [self, st] {
          if (--st->pending == 0) self->answer_lora_update(*st);
        });
      });
    }
    if (--st->pending == 0) answer_lora_update(*st);
  }

  void answer_lora_update(const LoraFanout& st) {
    std::size_t succeeded = 0;
    std::optional<std::size_t> first_ok, first_refusal;
    std::string detail;
    for (std::size_t k = 0; k < st.replies.size(); ++k) {
      const auto& reply = *st.replies[k];
      const bool good = reply && reply->status >= 200 && reply->status < 300;
      if (good) {
        ++succeeded;
        if (!first_ok) first_ok = k;
        continue;
      }
      if (!first_refusal) first_refusal = k;
      detail += "; " + st.asked[k]->name() + " " +
                (reply ? "answered " + std::to_string(reply->status) + ": " + reply->body.substr(0, 300)
                       : reply.error().message);
    }
    if (succeeded == st.replies.size() || (!first_ok && *st.replies[*first_refusal])) {
      // All accepted, or all refused: the first worker's answer.
      const auto& reply = **st.replies[first_ok ? *first_ok : *first_refusal];
      auto res = std::make_shared<http::response<http::string_body>>();
      res->result(static_cast<http::status>(reply.status));
      res->version(11);
      if (!reply.content_type.empty()) res->set(http::field::content_type, reply.content_type);
      res->body() = reply.body;
      return write_response(res);
    }
    const auto& refusal = *st.replies[*first_refusal];
    const unsigned status = refusal ? refusal->status : 502;
    send_error(make_error(std::to_string(succeeded) + " of " + std::to_string(st.replies.size()) +
                              " workers accepted it" + detail,
                          status >= 400 && status < 600 ? status : 502, "upstream_error", "partial_failure"));
  }

  struct ModelsFanout {
    int pending = 0;
    int answered = 0;  // workers that listed their models (200)
    json::array data;
    std::vector<std::string> seen;
    std::optional<backends::SimpleResponse> refused;  // a 401 or 403, passed on if no worker answered 200
  };

  void on_models_reply(std::shared_ptr<ModelsFanout> st, Result<backends::SimpleResponse> r) {
    if (r && (r->status == 401 || r->status == 403) && !st->refused) st->refused = std::move(*r);
    if (r && r->status == 200) {
      ++st->answered;
      boost::system::error_code ec;
      json::value v = json::parse(r->body, ec);
      if (!ec && v.is_object()) {
        if (const auto* d = v.get_object().if_contains("data"); d && d->is_array()) {
          for (const auto& m : d->get_array()) {
            const auto* mo = m.if_object();
            const auto* id = mo ? mo->if_contains("id") : nullptr;
            if (!id || !id->is_string()) continue;
            std::string s(id->get_string());
            if (std::find(st->seen.begin(), st->seen.end(), s) != st->seen.end()) continue;
            st->seen.push_back(s);
            st->data.push_back(m);
          }
        }
      }
    }
    if (--st->pending > 0) return;
    if (st->answered == 0 && st->refused) {
      // Every worker that answered refused the client's credentials: so does the router.
      return send_json(st->refused->status, std::move(st->refused->body));
    }
    json::object out;
    out["object"] = "list";
    out["data"] = std::move(st->data);
    send_json(200, json::serialize(out));
  }

  // ---- admin routes ----
  void handle_admin() {
    std::string_view target = req_.target();
    std::string_view path = target.substr(0, target.find('?'));
    if (path == "/metrics") {
      auto res = std::make_shared<http::response<http::string_body>>(http::status::ok, 11);
      res->set(http::field::content_type, "text/plain; version=0.0.4");
      if (bodies_) svc_.metrics.set_held_body_bytes(bodies_->held.load(std::memory_order_relaxed));
      svc_.router.background_held();  // lets go of those past --request-timeout, and sets the gauge
      res->body() = svc_.metrics.serialize();
      return write_response(res);
    }
    if (path == "/health") return send_json(200, R"({"status":"ok"})");
    if (path == "/admin/workers" && req_.method() == http::verb::get) {
      json::array arr;
      const auto workers = svc_.registry.snapshot();
      for (const auto& w : *workers) {
        const auto t = w->telemetry();
        json::object o;
        o["id"] = w->id();
        o["name"] = w->name();
        o["url"] = w->endpoint().url;
        o["healthy"] = w->healthy();
        o["cordoned"] = w->cordoned();
        o["in_flight"] = w->in_flight();
        json::array models;
        for (const auto& m : w->models()) models.emplace_back(m);
        o["models"] = std::move(models);
        o["indexed_blocks"] = svc_.router.index().worker_blocks(w->id());
        o["mode"] = w->precise() ? "precise" : "approximate";
        o["prefix_commit"] = svc_.router.prefix_commit(w->id());
        const auto rates = svc_.router.learned_rates(w->id());
        o["prefill_tokens_per_s"] = rates.prefill_tokens_per_s;
        o["decode_step_s"] = rates.decode_step_s * rates.decode_correction;
        o["rate_samples"] = rates.prefill_samples;
        if (svc_.describe_events) svc_.describe_events(w->id(), o);
        if (t.valid) {
          o["running"] = t.running;
          o["waiting"] = t.waiting;
          o["kv_usage"] = t.kv_usage;
          o["num_gpu_blocks"] = t.num_gpu_blocks;
        }
        arr.push_back(std::move(o));
      }
      json::object out;
      out["policy"] = std::string(svc_.router.policy().name());
      out["workers"] = std::move(arr);
      out["sessions"] = svc_.router.session_count();
      out["index_entries"] = svc_.router.index().entries();
      // The fleet's cache efficiency since start (docs/operations.md, "Cache efficiency"): the fleet's totals,
      // then each pool of workers that can hold the same blocks (router/cache_pools.h).
      const auto& pools = svc_.router.cache_pools();
      const auto [hits_workers, hits_shared] = svc_.metrics.fleet_cache_hits();
      json::object sc;
      sc["capacity_blocks"] = pools.capacity_blocks();
      sc["sample_rate"] = pools.sample_rate();
      sc["hit_tokens_workers"] = hits_workers;
      sc["hit_tokens_shared"] = hits_shared;
      if (hits_shared > 0) sc["efficiency"] = hits_workers / hits_shared;
      json::array pool_list;
      std::size_t entries = 0;
      for (const auto& p : pools.pools()) {
        json::object po;
        po["workers"] = json::array(p.workers.begin(), p.workers.end());
        po["models"] = json::array(p.models.begin(), p.models.end());
        po["capacity_blocks"] = p.capacity_blocks;
        po["sample_rate"] = p.sample_rate;
        po["entries"] = p.entries;
        po["hit_tokens_workers"] = p.hit_tokens_workers;
        po["hit_tokens_shared"] = p.hit_tokens_shared;
        if (p.hit_tokens_shared > 0) {
          po["efficiency"] = static_cast<double>(p.hit_tokens_workers) / static_cast<double>(p.hit_tokens_shared);
        }
        entries += p.entries;
        pool_list.push_back(std::move(po));
      }
      sc["entries"] = entries;
      sc["pools"] = std::move(pool_list);
      out["shared_cache"] = std::move(sc);
      return send_json(200, json::serialize(out));
    }
    if (path == "/admin/workers" && req_.method() == http::verb::post) {
      // The attributes of a --worker flag, by their YAML names: {"url": "http://HOST:PORT", "kv_events": EP,
      // "kv_events_replay": EP, "model": NAME, "dp_size": N}; all but url optional.
      boost::system::error_code ec;
      json::value v = json::parse(req_.body(), ec);
      const json::object* o = ec ? nullptr : v.if_object();
      const json::value* url = o ? o->if_contains("url") : nullptr;
      if (!url || !url->is_string()) {
        return send_error(make_error("body must be {\"url\": \"http://HOST:PORT\"} (optional: kv_events, kv_events_replay, "
                                     "model, dp_size)",
                                     400, "invalid_request_error", "invalid_value"));
      }
      auto ep = backends::parse_worker_url(url->get_string());
      if (!ep) return send_error(ep.error());
      for (const auto& [key, value] : *o) {
        std::string* field = key == "kv_events"          ? &ep->kv_events_endpoint
                             : key == "kv_events_replay" ? &ep->kv_events_replay
                             : key == "model"            ? &ep->model
                                                         : nullptr;
        if (field) {
          if (!value.is_string()) {
            return send_error(
                make_error("'" + std::string(key) + "' must be a string", 400, "invalid_request_error", "invalid_type"));
          }
          *field = value.get_string();
        } else if (key == "dp_size") {
          if (!value.is_int64() || value.get_int64() < 1 || value.get_int64() > 1024) {
            return send_error(
                make_error("'dp_size' must be an integer from 1 to 1024", 400, "invalid_request_error", "invalid_value"));
          }
          ep->dp_size = static_cast<std::uint32_t>(value.get_int64());
        } else if (key != "url") {
          return send_error(make_error("unknown worker attribute '" + std::string(key) +
                                           "' (url, kv_events, kv_events_replay, model, dp_size)",
                                       400, "invalid_request_error", "invalid_value"));
        }
      }
      auto id = svc_.registry.add(*ep);
      if (!id) return send_error(make_error(id.error().message, 409, "invalid_request_error", "conflict"));
      LOG_INFO("worker " << ep->name << " added through the admin API");
      return send_json(201, "{\"id\":" + std::to_string(*id) + "}");
    }
    if (path.starts_with("/admin/workers/") && path.ends_with("/blocks") && req_.method() == http::verb::get) {
      // The blocks the router believes a worker holds, in kvroute's own hash space (docs/hashing.md), as
      // decimal strings of the unsigned 64-bit hashes (JSON numbers lose precision above 2^53).
      const std::string name(path.substr(15, path.size() - 15 - 7));
      const auto w = svc_.registry.find_by_name(name);
      if (!w) return send_error(no_worker_named(name));
      json::array gpu, cpu, predicted;
      for (const auto& [h, tier] : svc_.router.index().worker_entries(w->id())) {
        auto& arr = tier == hashing::Tier::kGpu ? gpu : tier == hashing::Tier::kCpu ? cpu : predicted;
        arr.emplace_back(std::to_string(h));
      }
      json::object out;
      out["worker"] = w->name();
      out["mode"] = w->precise() ? "precise" : "approximate";
      out["gpu"] = std::move(gpu);
      out["cpu"] = std::move(cpu);
      out["predicted"] = std::move(predicted);
      return send_json(200, json::serialize(out));
    }
    if (path.starts_with("/admin/workers/") && req_.method() == http::verb::post &&
        (path.ends_with("/cordon") || path.ends_with("/uncordon"))) {
      // Takes a worker out of rotation for new requests, or puts it back; requests in flight are not touched.
      const bool cordon = path.ends_with("/cordon");
      const std::string name(path.substr(15, path.size() - 15 - (cordon ? 7 : 9)));
      const auto w = svc_.registry.find_by_name(name);
      if (!w) return send_error(no_worker_named(name));
      w->set_cordoned(cordon);
      if (auto s = svc_.metrics.worker(w->id())) s->cordoned->Set(cordon ? 1 : 0);
      LOG_INFO("worker " << w->name() << (cordon ? " cordoned" : " uncordoned") << " through the admin API ("
                         << w->in_flight() << " requests in flight)");
      return send_json(200, std::string("{\"worker\":") + json::serialize(json::value(w->name())) +
                                ",\"cordoned\":" + (cordon ? "true" : "false") +
                                ",\"in_flight\":" + std::to_string(w->in_flight()) + "}");
    }
    if (path.starts_with("/admin/workers/") && req_.method() == http::verb::delete_) {
      const std::string name(path.substr(15));
      const auto w = svc_.registry.find_by_name(name);
      if (!w) return send_error(no_worker_named(name));
      svc_.registry.remove(w->id());  // the app's listener drops its pooled connections on every thread
      LOG_INFO("worker " << w->name() << " removed through the admin API");
      return send_json(200, R"({"removed":true})");
    }
    send_error(make_error("no route for " + std::string(req_.method_string()) + " " + std::string(path), 404,
                          "invalid_request_error", "unknown_route"));
  }

  // ---- responses ----
  static Error no_worker_named(const std::string& name) {
    return make_error("no worker named '" + name + "'", 404, "invalid_request_error", "not_found");
  }

  void method_not_allowed(const char* allowed) {
    send_error(make_error("method " + std::string(req_.method_string()) + " is not allowed here (use " + allowed + ")",
                          405, "invalid_request_error", "method_not_allowed"));
  }

  void send_error(const Error& e) {
    auto res = json_response(e.status, error_json(e));
    // A sheddable request refused while the fleet is saturated: it can come back in a moment.
    if (e.status == 429) res->set(http::field::retry_after, "1");
    write_response(res);
  }

  void send_json(unsigned status, std::string body) { write_response(json_response(status, std::move(body))); }

  static std::shared_ptr<http::response<http::string_body>> json_response(unsigned status, std::string body) {
    auto res = std::make_shared<http::response<http::string_body>>(static_cast<http::status>(status), 11);
    res->set(http::field::content_type, "application/json");
    res->body() = std::move(body);
    return res;
  }

  void write_response(std::shared_ptr<http::response<http::string_body>> res) {
    access_.status = res->result_int();
    common_headers(*res, request_id_);
    res->keep_alive(!close_after_);
    res->prepare_payload();
    stream_.expires_after(seconds(svc_.config.client_idle_timeout_s));
    http::async_write(stream_, *res, [self = shared_from_this(), res](beast::error_code ec, std::size_t) {
      if (ec || self->close_after_ || self->drain_->draining) return self->do_close();
      self->do_read();
    });
  }

  // The request read last has been answered in full, or will not be: it no longer holds up a drain.
  void end_exchange() {
    if (body_reserved_ > 0) {
      bodies_->release(body_reserved_);
      body_reserved_ = 0;
    }
    budget_waited_ = false;
    if (!counted_) return;
    counted_ = false;
    --drain_->active;
    if (access_log_) write_access_log();
  }

  // ---- access log (--access-log) ----
  struct AccessRecord {
    std::chrono::system_clock::time_point at;     // the request was read
    std::chrono::steady_clock::time_point start;
    unsigned status = 0;                           // 0: no answer was sent
    bool client_gone = false;                      // the client left before the response ended
    std::string_view reason;                       // the routing decision's, for prefix-routed requests
    std::uint64_t prompt_tokens = 0, predicted_cached_tokens = 0;
    std::optional<Usage> usage;                    // what the worker reported
    double ttft_s = -1;
  };

  void note_decision() {
    access_.reason = policy::reason_name(decision_->pick.reason);
    access_.prompt_tokens = decision_->prompt_tokens;
    access_.predicted_cached_tokens = decision_->pick.predicted_cached_tokens;
  }

  // One JSON object per line on stdout (one fwrite, so lines of different threads do not mix).
  void write_access_log() {
    json::object o;
    o["time"] = log::timestamp(access_.at);
    o["request_id"] = request_id_;
    o["method"] = req_.method_string();
    std::string_view target = req_.target();
    o["path"] = target.substr(0, target.find('?'));
    o["status"] = access_.status;
    if (access_.client_gone) o["client_gone"] = true;
    if (worker_) o["worker"] = worker_->name();
    if (!access_.reason.empty()) {
      o["reason"] = access_.reason;
      o["predicted_cached_tokens"] = access_.predicted_cached_tokens;
    }
    if (access_.usage) {
      o["prompt_tokens"] = access_.usage->prompt_tokens;
      o["cached_tokens"] = access_.usage->cached_tokens;
      o["completion_tokens"] = access_.usage->completion_tokens;
    } else if (access_.prompt_tokens > 0) {
      o["prompt_tokens"] = access_.prompt_tokens;  // the router's estimate: the worker reported none
    }
    if (access_.ttft_s >= 0) o["ttft_s"] = access_.ttft_s;
    o["duration_s"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - access_.start).count();
    std::string line = json::serialize(o);
    line.push_back('\n');
    std::fwrite(line.data(), 1, line.size(), stdout);
  }

  void do_close() {
    end_exchange();
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.socket().close(ec);
    idle_.cancel();
    deadline_.cancel();
    watch_.cancel();
  }

  beast::tcp_stream stream_;
  Services& svc_;
  Listener::Kind kind_;
  // The session may outlive svc_ (see Services::drain): what its destructor needs is its own.
  std::shared_ptr<DrainState> drain_;
  std::shared_ptr<BodyBudget> bodies_;
  const bool access_log_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  bool reading_ = false;  // a request is being read (the idle timeout applies)
  bool continue_sent_ = false;  // "100 Continue" answered this request's Expect
  std::uint64_t body_reserved_ = 0;  // this request's share of --max-held-body-bytes (grows as its body is read)
  bool budget_waited_ = false;       // counted in kvroute_body_budget_waits_total
  std::optional<asio::steady_timer> budget_timer_;
  std::optional<asio::steady_timer> hold_timer_;  // a prefix hold's checks
  std::uint64_t hold_seq_ = 0;                    // the latest wake-up or check of a prefix hold
  HoldWaiters::Id hold_watch_ = 0;                // its watch in the router (Router::watch_prefix_hold)
  static constexpr auto kPrefixHoldRecheck = std::chrono::milliseconds(20);
  LazyDeadline<ApiSession> idle_{stream_.get_executor(), &ApiSession::on_idle};  // --client-idle-timeout
  http::request<http::string_body> req_;
  std::string request_id_;
  bool close_after_ = false;
  bool counted_ = false;  // this request is in DrainState::active
  AccessRecord access_;

  std::optional<Decision> decision_;
  std::optional<RoutableRequest> routable_;  // the routed request, for routing it again (connect_failed)
  std::string passthrough_model_;            // the model a passed-through request names, if any
  int reroutes_ = 0;
  std::shared_ptr<backends::Worker> worker_;
  std::string up_head_;          // start line and fields of the request to the worker
  std::string_view up_body_view_;  // its body: up_body_ or req_'s
  backends::UpstreamPool::Lease lease_;
  std::shared_ptr<beast::tcp_stream> orphan_;  // the upstream connection client_gone() closed
  LazyDeadline<ApiSession> deadline_{stream_.get_executor(), &ApiSession::on_deadline};  // --request-timeout
  LazyDeadline<ApiSession> watch_{stream_.get_executor(), &ApiSession::on_watch_due};  // kWatchClientAfter
  std::uint64_t watched_ = ~std::uint64_t{0};                  // the generation whose client is watched
  bool awaiting_head_ = false;                                // the worker has not answered yet
  bool retried_ = false;
  beast::flat_buffer up_buffer_;
  std::optional<http::response_parser<http::buffer_body>> up_parser_;
  std::string down_head_;        // status line and fields of the response to the client
  bool head_pending_ = false;    // down_head_ has not been written yet
  bool down_chunked_ = false;    // the client's response is chunk-framed by the relay
  bool down_last_ = false;       // the write under way ends the response
  std::array<char, 24> chunk_line_{};
  std::array<char, kRelayChunk> relay_{};
  std::string tail_;
  bool capture_id_ = false;    // a Responses API response whose id has not been read yet
  bool id_in_events_ = false;  // ... streamed: the id is in the first event
  bool await_output_ = false;  // a Responses API stream before its first output event (no first byte yet)
  std::string id_head_;        // the response's first bytes, until its id is read
  // A background response the router holds load for, polled (its status read from the answer) or ended here.
  enum class BackgroundWatch : std::uint8_t { kNone, kPoll, kEnd };
  BackgroundWatch background_watch_ = BackgroundWatch::kNone;
  std::string background_id_;
  std::unique_ptr<ResponseStatusReader> status_reader_;
  bool strip_usage_ = false;   // this request's usage event was added by the router
  bool strip_active_ = false;  // ... and the response is an event stream to remove it from
  std::string up_body_;        // rewritten upstream body, when not empty
  std::string sse_;            // bytes of an incomplete event (strip mode)
  std::optional<Usage> stream_usage_;  // the usage of the removed event (strip mode)
  std::string out_;            // events to send on (strip mode)
  unsigned status_ = 0;
  std::uint64_t generation_ = 0;
};

}  // namespace

Result<tcp::endpoint> resolve_listen(const std::string& host_port) {
  auto colon = host_port.rfind(':');
  if (colon == std::string::npos) return make_error("listen address '" + host_port + "' must be HOST:PORT");
  std::string host = host_port.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host == "localhost") host = "127.0.0.1";
  if (host.empty()) host = "0.0.0.0";
  unsigned long port = 0;
  try {
    port = std::stoul(host_port.substr(colon + 1));
  } catch (...) {
    return make_error("listen address '" + host_port + "': bad port");
  }
  if (port > 65535) return make_error("listen address '" + host_port + "': bad port");
  boost::system::error_code ec;
  auto addr = asio::ip::make_address(host, ec);
  if (ec) return make_error("listen address '" + host_port + "': '" + host + "' is not an IP address");
  return tcp::endpoint(addr, static_cast<unsigned short>(port));
}

Listener::Listener(asio::io_context& io, Services& services, Kind kind)
    : io_(io), acceptor_(io), retry_(io), services_(services), kind_(kind) {}

Result<bool> Listener::open(const tcp::endpoint& endpoint, bool reuse_port) {
  beast::error_code ec;
  acceptor_.open(endpoint.protocol(), ec);
  if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec && reuse_port) acceptor_.set_option(asio::detail::socket_option::boolean<SOL_SOCKET, SO_REUSEPORT>(true), ec);
  if (!ec) acceptor_.bind(endpoint, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return make_error("cannot listen on " + endpoint.address().to_string() + ":" + std::to_string(endpoint.port()) +
                      ": " + ec.message());
  }
  return true;
}

void Listener::run() { do_accept(); }

void Listener::stop() {
  asio::post(acceptor_.get_executor(), [self = shared_from_this()] {
    beast::error_code ec;
    self->acceptor_.close(ec);
    self->retry_.cancel();
  });
}

tcp::endpoint Listener::local_endpoint() const {
  beast::error_code ec;
  return acceptor_.local_endpoint(ec);
}

void Listener::do_accept() {
  // Each io_context is run by exactly one thread (router/app.h), so a session needs no strand: all its
  // handlers run on that thread.
  acceptor_.async_accept(io_, [self = shared_from_this()](beast::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted) return;
    if (!ec) {
      socket.set_option(tcp::no_delay(true), ec);
      std::make_shared<ApiSession>(std::move(socket), self->services_, self->kind_)->run();
    } else if (net::local_resource_error(ec)) {
      return self->accept_later(ec);
    } else {
      LOG_WARN("accept: " << ec.message());
    }
    self->do_accept();
  });
}

void Listener::accept_later(const boost::system::error_code& ec) {
  services_.metrics.error("accept");
  ++unwarned_;
  const auto now = std::chrono::steady_clock::now();
  if (now - warned_at_ >= std::chrono::seconds(10)) {
    LOG_WARN("accept: " << ec.message() << " (" << unwarned_ << " failed accepts since the last warning)"
                        << "; new connections wait in the kernel's queue. Each request holds a client and a worker "
                           "connection: raise the open-files limit (ulimit -n)");
    warned_at_ = now;
    unwarned_ = 0;
  }
  retry_.expires_after(std::chrono::milliseconds(50));
  retry_.async_wait([self = shared_from_this()](beast::error_code wait_ec) {
    if (!wait_ec && self->acceptor_.is_open()) self->do_accept();
  });
}

}  // namespace kvroute::router
