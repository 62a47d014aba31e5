#include "backends/sim/server/worker.h"

#include <boost/asio/ip/address.hpp>
#include <boost/asio/socket_base.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "backends/sim/server/session.h"
#include "backends/sim/server/tokenizer.h"
#include "hashing/block_chain.h"
#include "net/resource_errors.h"

namespace kvroute::sim {

namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace {

// vLLM's TTFT buckets (seconds) and a coarser set for end-to-end latency.
const std::vector<double> kTtftBuckets = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                                          1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
const std::vector<double> kE2eBuckets = {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
                                         40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

void observe(const std::vector<double>& buckets, std::vector<std::uint64_t>& counts, double v) {
  for (std::size_t i = 0; i < buckets.size(); ++i) {
    if (v <= buckets[i]) {
      ++counts[i];
      return;
    }
  }
  ++counts.back();  // the +Inf bucket
}

// The figures whose change makes a native LoadReport due; the cumulative prefix-cache counters ride along
// but move with every admission, which running / waiting already report.
bool same_load(const events::WorkerTelemetry& a, const events::WorkerTelemetry& b) {
  return a.running == b.running && a.waiting == b.waiting && a.kv_usage == b.kv_usage &&
         a.num_gpu_blocks == b.num_gpu_blocks && a.num_cpu_blocks == b.num_cpu_blocks && a.block_size == b.block_size;
}

std::chrono::steady_clock::duration wall_seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}

std::string fmt_double(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.12g", v);
  return buf;
}

}  // namespace

// Forwards engine callbacks to the observers and collects the KV events of one advance() into a batch.
class SimWorker::Sink : public EngineSink {
 public:
  explicit Sink(SimWorker& w) : w_(w), batch_(w.config_.kv_events_encoding) {}

  void on_first_token(std::uint64_t id, double t, std::uint32_t cached_tokens, std::uint32_t) override {
    auto it = w_.inflight_.find(id);
    if (it == w_.inflight_.end()) return;
    const double ttft = t - it->second.submitted_at;
    observe(kTtftBuckets, w_.ttft_counts_, ttft);
    w_.ttft_sum_ += ttft;
    ++w_.ttft_count_;
    auto obs = it->second.observer;  // keep the session alive across the call
    obs->on_first_token(cached_tokens);
  }
  void on_token(std::uint64_t id, double, std::uint32_t index) override {
    auto it = w_.inflight_.find(id);
    if (it == w_.inflight_.end()) return;
    auto obs = it->second.observer;
    obs->on_token(index);
  }
  void on_finish(std::uint64_t id, double t, const Usage& usage) override {
    auto it = w_.inflight_.find(id);
    if (it == w_.inflight_.end()) return;
    const double e2e = t - it->second.submitted_at;
    observe(kE2eBuckets, w_.e2e_counts_, e2e);
    w_.e2e_sum_ += e2e;
    ++w_.e2e_count_;
    ++w_.requests_success_;
    auto obs = std::move(it->second.observer);
    w_.inflight_.erase(it);
    obs->on_finish(ApiUsage{usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens});
  }

  void on_blocks_stored(std::span<const std::uint64_t> hashes, std::optional<std::uint64_t> parent,
                        std::uint64_t request_id, std::uint32_t first_block_index, Medium medium, double) override {
    const std::uint32_t bt = w_.engine_.config().block_tokens;
    const auto req = w_.inflight_.find(request_id);
    tokens_.clear();
    for (std::size_t k = 0; k < hashes.size(); ++k) {
      auto& entry = w_.block_tokens_[hashes[k]];
      if (entry.tokens.empty() && req != w_.inflight_.end()) {
        const std::size_t begin = static_cast<std::size_t>(first_block_index + k) * bt;
        const auto& toks = req->second.tokens;
        if (begin + bt <= toks.size()) entry.tokens.assign(toks.begin() + begin, toks.begin() + begin + bt);
        entry.lora = req->second.lora;
        // vLLM mixes cache_salt into the prompt's first block only, and publishes it in that block's extra keys.
        if (first_block_index + k == 0) entry.salt = req->second.cache_salt;
      }
      if (k == 0) {
        lora_ = entry.lora;  // one request's blocks: one namespace
        salt_ = parent ? std::string() : entry.salt;
      }
      entry.media |= static_cast<std::uint8_t>(1u << static_cast<unsigned>(medium));
      tokens_.insert(tokens_.end(), entry.tokens.begin(), entry.tokens.end());
    }
    if (w_.publisher_) batch_.stored(hashes, parent, tokens_, bt, medium_name(medium), lora_, salt_);
  }
  void on_blocks_removed(std::span<const std::uint64_t> hashes, Medium medium, double) override {
    for (std::uint64_t h : hashes) {
      auto it = w_.block_tokens_.find(h);
      if (it == w_.block_tokens_.end()) continue;
      it->second.media &= static_cast<std::uint8_t>(~(1u << static_cast<unsigned>(medium)));
      if (it->second.media == 0) w_.block_tokens_.erase(it);
    }
    if (w_.publisher_) batch_.removed(hashes, medium_name(medium));
  }
  void on_all_cleared(double) override {
    w_.block_tokens_.clear();
    if (w_.publisher_) batch_.cleared();
  }

  KvEventBatch& batch() { return batch_; }

 private:
  SimWorker& w_;
  KvEventBatch batch_;
  std::vector<std::uint32_t> tokens_;
  std::string lora_;
  std::string salt_;
};

Result<std::shared_ptr<SimWorker>> SimWorker::create(net::io_context& io, SimWorkerConfig config) {
  Engine engine(config.engine);
  std::shared_ptr<SimWorker> w(new SimWorker(io, std::move(config), std::move(engine)));
  const auto& c = w->config_;
  const std::string where = c.host + ":" + std::to_string(c.port);
  boost::system::error_code ec;
  const auto addr = net::ip::make_address(c.host, ec);
  if (ec) return make_error("--host: '" + c.host + "' is not an IP address", 500, "server_error");
  const tcp::endpoint ep(addr, c.port);
  w->acceptor_.open(ep.protocol(), ec);
  if (!ec) w->acceptor_.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) w->acceptor_.bind(ep, ec);
  if (!ec) w->acceptor_.listen(net::socket_base::max_listen_connections, ec);
  if (ec) return make_error("cannot listen on " + where + ": " + ec.message(), 500, "server_error");
  if (!c.kv_events.endpoint.empty()) {
    auto pub = KvEventPublisher::open(c.zmq_context, c.kv_events);
    if (!pub) return pub.error();
    w->publisher_ = std::move(*pub);
  }
  return w;
}

SimWorker::SimWorker(net::io_context& io, SimWorkerConfig config, Engine engine)
    : io_(io),
      config_(std::move(config)),
      engine_(std::move(engine)),
      acceptor_(io),
      accept_retry_(io),
      timer_(io),
      load_timer_(io),
      delay_timer_(io) {
  for (const auto& [name, path] : config_.lora_modules) {
    lora_names_.push_back(name);
    lora_paths_.push_back(path);
  }
  config_.limits.lora_adapters = &lora_names_;
}

Result<std::string> SimWorker::load_lora_adapter(const std::string& name, const std::string& path) {
  if (name.empty() || path.empty()) return make_error("Both 'lora_name' and 'lora_path' must be provided.");
  if (std::find(lora_names_.begin(), lora_names_.end(), name) != lora_names_.end()) {
    return make_error("The lora adapter '" + name + "' has already been loaded.");
  }
  lora_names_.push_back(name);
  lora_paths_.push_back(path);
  return "Success: LoRA adapter '" + name + "' added successfully.";
}

Result<std::string> SimWorker::unload_lora_adapter(const std::string& name) {
  if (name.empty()) return make_error("'lora_name' needs to be provided to unload a LoRA adapter.");
  const auto it = std::find(lora_names_.begin(), lora_names_.end(), name);
  if (it == lora_names_.end()) {
    return make_error("The lora adapter '" + name + "' cannot be found.", 404, "NotFoundError");
  }
  lora_paths_.erase(lora_paths_.begin() + (it - lora_names_.begin()));
  lora_names_.erase(it);
  return "Success: LoRA adapter '" + name + "' removed successfully.";
}

SimWorker::~SimWorker() = default;

void SimWorker::start() {
  start_ = std::chrono::steady_clock::now();
  created_ = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
                 .count();
  do_accept();
  if (native_events()) arm_load_timer(start_);  // a first report right away, then one per interval
}

void SimWorker::stop() {
  stopped_ = true;
  boost::system::error_code ignored;
  acceptor_.close(ignored);
  accept_retry_.cancel();
  timer_.cancel();
  load_timer_.cancel();
  delay_timer_.cancel();
  // In-flight requests hold their sessions and the sessions hold this worker: break the cycle.
  inflight_.clear();
}

void SimWorker::do_accept() {
  if (stopped_) return;
  acceptor_.async_accept([self = shared_from_this()](boost::system::error_code ec, tcp::socket socket) {
    if (ec == net::error::operation_aborted || self->stopped_) return;
    if (!ec) {
      boost::system::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);  // SSE chunks must not wait for Nagle
      std::make_shared<SimSession>(std::move(socket), self)->run();
    }
    if (kvroute::net::local_resource_error(ec)) {
      // The connection stays queued in the kernel: retrying at once would fail at once, spinning a core.
      self->accept_retry_.expires_after(std::chrono::milliseconds(50));
      self->accept_retry_.async_wait([self](boost::system::error_code wait_ec) {
        if (!wait_ec && !self->stopped_) self->do_accept();
      });
      return;
    }
    self->do_accept();  // other errors concern that one connection
  });
}

double SimWorker::engine_now() {
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  last_now_ = std::max(last_now_, wall * config_.speed);
  return last_now_;
}

Result<SimWorker::Submitted> SimWorker::submit(ApiRequest request, std::shared_ptr<RequestObserver> observer) {
  if (stopped_) return make_error("worker is shutting down", 503, "server_error");
  const std::uint64_t id = next_id_++;
  Inflight f;
  f.observer = std::move(observer);
  f.prompt_tokens = static_cast<std::uint32_t>(request.prompt_tokens.size());
  f.lora = request.lora;
  f.cache_salt = request.cache_salt;
  f.tokens = std::move(request.prompt_tokens);
  const std::uint64_t fingerprint = prompt_fingerprint(f.tokens, config_.seed);
  // The output is known in advance (deterministic), so the chain covers prompt + output and the engine
  // caches output blocks as decoding fills them, like vLLM. Each generated piece is one token.
  f.tokens.reserve(f.tokens.size() + request.max_tokens);
  for (std::uint32_t i = 0; i < request.max_tokens; ++i) {
    tokenize_append(generated_piece(fingerprint, i), f.tokens);
  }
  f.tokens.resize(f.prompt_tokens + request.max_tokens, kNewlineToken);
  // An adapter's blocks are its own (vLLM keys them by the LoRA): the namespace is the adapter's name, which
  // is also the model name the router hashes its requests under.
  std::uint64_t root = hashing::namespace_root(
      request.lora.empty() ? config_.limits.served_model_name : request.lora, request.cache_salt);
  if (config_.seed != 0) root = hashing::hash_block(root, &config_.seed, sizeof config_.seed);
  auto chain = hashing::hash_tokens(root, f.tokens, engine_.config().block_tokens);
  const double now = engine_now();
  f.submitted_at = now;
  auto accepted = engine_.submit(
      SimRequest{.id = id, .block_hashes = std::move(chain.hashes), .prompt_tokens = f.prompt_tokens,
                 .max_tokens = request.max_tokens},
      now);
  if (!accepted) {
    ++requests_rejected_;
    Error e = accepted.error();
    if (e.status < 400 || e.status > 599) e.status = 400;
    return e;
  }
  inflight_.emplace(id, std::move(f));
  arm_timer();
  return Submitted{id, fingerprint};
}

void SimWorker::cancel(std::uint64_t id) {
  if (in_advance_) {
    // Called from an observer inside advance(): the engine is mid-call; cancel right after it returns.
    pending_cancels_.push_back(id);
    return;
  }
  engine_.cancel(id, engine_now());
  inflight_.erase(id);
  arm_timer();
}

void SimWorker::arm_timer() {
  if (stopped_) return;
  const double next = engine_.next_event_time();
  if (!std::isfinite(next)) return;  // idle; a stale wait that fires finds nothing to do
  const auto when = start_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                 std::chrono::duration<double>(next / config_.speed));
  if (armed_for_ <= when) return;  // an earlier wake-up is already pending; it re-arms after advancing
  armed_for_ = when;
  armed_engine_time_ = next;
  timer_.expires_at(when);  // cancels the later wait, whose handler sees operation_aborted
  timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) { self->on_timer(ec); });
}

void SimWorker::on_timer(boost::system::error_code ec) {
  if (ec == net::error::operation_aborted || stopped_) return;
  armed_for_ = std::chrono::steady_clock::time_point::max();
  // The wait ended at (or just after) the wall time of armed_engine_time_; rounding must not leave the
  // engine short of its own event, or we would spin re-arming the same instant.
  last_now_ = std::max(last_now_, armed_engine_time_);
  run_advance(engine_now());
  arm_timer();
}

void SimWorker::run_advance(double now) {
  Sink sink(*this);
  in_advance_ = true;
  engine_.advance(now, sink);
  in_advance_ = false;
  publish(sink.batch());
  if (!pending_cancels_.empty()) {
    auto ids = std::move(pending_cancels_);
    pending_cancels_.clear();
    for (std::uint64_t id : ids) {
      engine_.cancel(id, now);
      inflight_.erase(id);
    }
  }
}

bool SimWorker::reset_prefix_cache() {
  Sink sink(*this);
  in_advance_ = true;
  const bool ok = engine_.reset_prefix_cache(engine_now(), sink);
  in_advance_ = false;
  publish(sink.batch());
  return ok;
}

void SimWorker::publish(KvEventBatch& batch) {
  if (!publisher_) return;
  if (!native_events()) {
    if (!batch.empty()) send(batch, nullptr);
    return;
  }
  const events::WorkerTelemetry load = load_report();
  const bool changed = !load_sent_ || !same_load(load, *load_sent_);
  if (!batch.empty()) {
    send(batch, changed ? &load : nullptr);  // the load rides along for free
  } else if (changed && !load_dirty_) {
    // A change without cache events (a request finished, say): report it soon, but at most ten load-only
    // batches per interval, so a busy worker does not spend its replay buffer on them.
    load_dirty_ = true;
    arm_load_timer(std::max(std::chrono::steady_clock::now(),
                            load_sent_at_ + wall_seconds(config_.kv_events_load_interval_s / 10)));
  }
}

void SimWorker::send(KvEventBatch& batch, const events::WorkerTelemetry* load) {
  const double ts =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  // The native payload repeats the frame's sequence number (proto/kv_events.proto, EventBatch.seq).
  std::string payload = batch.encode(ts, 0, load, publisher_->next_seq());
  if (config_.kv_events_delay_s > 0) {
    // Late, in order: as a publisher thread's queue or a slow network would deliver it.
    const auto due = std::chrono::steady_clock::now() + wall_seconds(config_.kv_events_delay_s);
    delayed_.emplace_back(due, std::move(payload));
    if (delayed_.size() == 1) arm_delay_timer();
  } else {
    publisher_->publish(std::move(payload));
  }
  ++kv_event_batches_;
  if (load != nullptr) {
    load_sent_ = *load;
    load_sent_at_ = std::chrono::steady_clock::now();
    load_dirty_ = false;
  }
}

void SimWorker::publish_delayed() {
  const auto now = std::chrono::steady_clock::now();
  while (!delayed_.empty() && delayed_.front().first <= now) {
    publisher_->publish(std::move(delayed_.front().second));
    delayed_.pop_front();
  }
  if (!delayed_.empty()) arm_delay_timer();
}

void SimWorker::arm_delay_timer() {
  delay_timer_.expires_at(delayed_.front().first);
  delay_timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
    if (ec != net::error::operation_aborted && !self->stopped_) self->publish_delayed();
  });
}

events::WorkerTelemetry SimWorker::load_report() const {
  const EngineStats s = engine_.stats();
  events::WorkerTelemetry t;
  t.engine = events::EngineKind::kNative;
  t.running = s.running;
  t.waiting = s.waiting;
  t.kv_usage = s.kv_usage;
  t.num_gpu_blocks = s.num_gpu_blocks;
  t.num_cpu_blocks = s.num_cpu_blocks;
  t.block_size = s.block_tokens;
  t.prefix_cache_queries = static_cast<double>(s.prefix_cache_queries);
  t.prefix_cache_hits = static_cast<double>(s.prefix_cache_hits);
  return t;
}

void SimWorker::arm_load_timer(std::chrono::steady_clock::time_point when) {
  if (stopped_) return;
  if (load_armed_for_ <= when) return;  // an earlier wake-up is pending; it re-arms after reporting
  load_armed_for_ = when;
  load_timer_.expires_at(when);  // cancels the later wait, whose handler sees operation_aborted
  load_timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) { self->on_load_timer(ec); });
}

void SimWorker::on_load_timer(boost::system::error_code ec) {
  if (ec == net::error::operation_aborted || stopped_) return;
  load_armed_for_ = std::chrono::steady_clock::time_point::max();
  const auto interval = wall_seconds(config_.kv_events_load_interval_s);
  if (load_dirty_ || !load_sent_ || std::chrono::steady_clock::now() >= load_sent_at_ + interval) {
    KvEventBatch load_only(KvEventEncoding::kNative);
    const events::WorkerTelemetry load = load_report();
    send(load_only, &load);
  }
  arm_load_timer(load_sent_at_ + interval);
}

std::string SimWorker::models_json() const {
  std::string out = "{\"object\":\"list\",\"data\":[{\"id\":";
  append_json_string(out, config_.limits.served_model_name);
  out.append(",\"object\":\"model\",\"created\":").append(std::to_string(created_));
  out.append(",\"owned_by\":\"kvroute-sim\",\"root\":");
  append_json_string(out, engine_.config().model.name);
  out.append(",\"parent\":null,\"max_model_len\":").append(std::to_string(config_.limits.max_model_len));
  out.append(",\"permission\":[]}");
  // Loaded adapters, as vLLM lists them: the adapter's path as root, the base model as parent.
  for (std::size_t i = 0; i < lora_names_.size(); ++i) {
    out.append(",{\"id\":");
    append_json_string(out, lora_names_[i]);
    out.append(",\"object\":\"model\",\"created\":").append(std::to_string(created_));
    out.append(",\"owned_by\":\"kvroute-sim\",\"root\":");
    append_json_string(out, lora_paths_[i]);
    out.append(",\"parent\":");
    append_json_string(out, config_.limits.served_model_name);
    out.append(",\"max_model_len\":null,\"permission\":[]}");
  }
  out.append("]}");
  return out;
}

std::string SimWorker::kv_blocks_json() const {
  // Hashes as decimal strings of the unsigned 64-bit value: JSON numbers lose precision above 2^53 in
  // most clients. KV events carry the same bits as signed int64.
  std::string out = "{\"block_size\":" + std::to_string(engine_.config().block_tokens) + ",\"gpu\":[";
  const auto gpu = engine_.cached_block_hashes(Medium::kGpu);
  for (std::size_t i = 0; i < gpu.size(); ++i) {
    if (i) out.push_back(',');
    out.append("\"").append(std::to_string(gpu[i])).append("\"");
  }
  out.append("],\"cpu\":[");
  const auto cpu = engine_.cached_block_hashes(Medium::kCpu);
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    if (i) out.push_back(',');
    out.append("\"").append(std::to_string(cpu[i])).append("\"");
  }
  out.append("]}");
  return out;
}

std::string SimWorker::metrics_text() const {
  const EngineStats s = engine_.stats();
  const auto& ec = engine_.config();
  std::string label = "model_name=";
  append_json_string(label, config_.limits.served_model_name);  // a JSON string is a valid label value here
  label.append(",engine=\"0\"");
  std::string out;
  out.reserve(8192);
  auto gauge = [&](const char* name, const char* help, double v) {
    out.append("# HELP ").append(name).append(" ").append(help).append("\n# TYPE ").append(name).append(" gauge\n");
    out.append(name).append("{").append(label).append("} ").append(fmt_double(v)).append("\n");
  };
  // A counter is exposed as prometheus_client (which vLLM uses) writes the text format: HELP, TYPE and sample
  // all name the family with its _total suffix (prometheus_client/exposition.py, generate_latest), which is
  // what `promtool check metrics` expects too.
  auto counter = [&](const char* name, const char* help, double v) {
    out.append("# HELP ").append(name).append("_total ").append(help);
    out.append("\n# TYPE ").append(name).append("_total counter\n");
    out.append(name).append("_total{").append(label).append("} ").append(fmt_double(v)).append("\n");
  };
  auto histogram = [&](const char* name, const char* help, const std::vector<double>& buckets,
                       const std::vector<std::uint64_t>& counts, double sum, std::uint64_t count) {
    out.append("# HELP ").append(name).append(" ").append(help).append("\n# TYPE ").append(name).append(" histogram\n");
    std::uint64_t cum = 0;
    for (std::size_t i = 0; i < buckets.size(); ++i) {
      cum += counts[i];
      out.append(name).append("_bucket{").append(label).append(",le=\"").append(fmt_double(buckets[i]));
      out.append("\"} ").append(std::to_string(cum)).append("\n");
    }
    out.append(name).append("_bucket{").append(label).append(",le=\"+Inf\"} ").append(std::to_string(count)).append("\n");
    out.append(name).append("_sum{").append(label).append("} ").append(fmt_double(sum)).append("\n");
    out.append(name).append("_count{").append(label).append("} ").append(std::to_string(count)).append("\n");
  };
  gauge("vllm:num_requests_running", "Number of requests in model execution batches.", s.running);
  gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", s.waiting);
  gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", s.kv_usage);
  gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage (older name). 1 means 100 percent usage.", s.kv_usage);
  counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
          static_cast<double>(s.prefix_cache_queries));
  counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
          static_cast<double>(s.prefix_cache_hits));
  counter("vllm:cpu_prefix_cache_hits", "Prefix tokens found on the CPU tier (kvroute-sim only).",
          static_cast<double>(s.cpu_cache_hits));
  counter("vllm:prompt_tokens", "Number of prefill tokens processed.", static_cast<double>(s.prompt_tokens_computed));
  counter("vllm:generation_tokens", "Number of generation tokens processed.", static_cast<double>(s.generation_tokens));
  counter("vllm:num_preemptions", "Cumulative number of preemptions from the engine.", static_cast<double>(s.preemptions));
  out.append("# HELP vllm:request_success_total Count of successfully processed requests.\n"
             "# TYPE vllm:request_success_total counter\n");
  out.append("vllm:request_success_total{").append(label).append(",finished_reason=\"length\"} ");
  out.append(std::to_string(requests_success_)).append("\n");
  counter("kvroute_sim:requests_rejected", "Requests the engine refused (e.g. larger than the KV pool).",
          static_cast<double>(requests_rejected_));
  counter("kvroute_sim:requests_cancelled", "Requests cancelled because their client went away.",
          static_cast<double>(s.requests_cancelled));
  counter("kvroute_sim:gpu_evictions", "Cached GPU blocks evicted for reuse.", static_cast<double>(s.gpu_evictions));
  counter("kvroute_sim:cpu_evictions", "Blocks dropped from the CPU tier.", static_cast<double>(s.cpu_evictions));
  counter("kvroute_sim:kv_event_batches", "KV-event batches published.", static_cast<double>(kv_event_batches_));
  gauge("kvroute_sim:gpu_cached_blocks", "Blocks with a hash on the GPU.", static_cast<double>(s.gpu_cached_blocks));
  gauge("kvroute_sim:cpu_cached_blocks", "Blocks with a hash on the CPU tier.", static_cast<double>(s.cpu_cached_blocks));
  gauge("kvroute_sim:speed", "Simulated seconds per wall second (--speed).", config_.speed);
  histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds (simulated time).",
            kTtftBuckets, ttft_counts_, ttft_sum_, ttft_count_);
  histogram("vllm:e2e_request_latency_seconds", "Histogram of end to end request latency in seconds (simulated time).",
            kE2eBuckets, e2e_counts_, e2e_sum_, e2e_count_);
  out.append("# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
             "# TYPE vllm:cache_config_info gauge\n");
  out.append("vllm:cache_config_info{block_size=\"").append(std::to_string(ec.block_tokens));
  out.append("\",cache_dtype=\"auto\",enable_prefix_caching=\"True\",gpu_memory_utilization=\"");
  out.append(fmt_double(ec.gpu_memory_utilization)).append("\",num_cpu_blocks=\"");
  out.append(std::to_string(s.num_cpu_blocks)).append("\",num_gpu_blocks=\"").append(std::to_string(s.num_gpu_blocks));
  out.append("\",engine=\"0\"} 1\n");
  return out;
}

}  // namespace kvroute::sim
