#include "backends/sim/server/server.h"

#include <boost/asio/post.hpp>

#include <algorithm>
#include <cctype>
#include <csignal>
#include <iostream>

#include <zmq.h>

namespace kvroute::sim {

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

std::string zmq_bind_host(const std::string& host) {
  // vLLM's endpoints bind "*" (all interfaces); follow --host so a loopback worker stays on loopback.
  return host == "0.0.0.0" ? "*" : host;
}

}  // namespace

Result<EngineConfig> engine_config_from(const SimServerOptions& o) {
  EngineConfig c;
  if (!o.model_config.empty()) {
    auto model = load_model_config(o.model_config);
    if (!model) return make_error("--model-config: " + model.error().message);
    auto gpu = builtin_gpu(lower(o.gpu));
    if (!gpu) return make_error("--gpu: " + gpu.error().message);
    c = EngineConfig::defaults();
    c.model = std::move(*model);
    c.gpu = std::move(*gpu);
  } else {
    auto made = EngineConfig::make(lower(o.model), lower(o.gpu));
    if (!made) return make_error("--model/--gpu: " + made.error().message);
    c = std::move(*made);
  }
  if (o.num_gpu_blocks) c.num_gpu_blocks = *o.num_gpu_blocks;
  if (o.max_num_seqs) c.max_num_seqs = static_cast<std::uint32_t>(*o.max_num_seqs);
  c.cpu_tier_bytes = o.cpu_tier_gb * 1e9;
  c.prefix_commit = o.prefix_commit;
  return c;
}

SimServer::SimServer() = default;

SimServer::ZmqContext::~ZmqContext() {
  if (ctx != nullptr) zmq_ctx_term(ctx);
}

SimServer::~SimServer() {
  for (auto& w : workers_) w->stop();
  workers_.clear();
  // Sessions and timers still queued hold workers (and so publishers); destroy them before the ZMQ context.
  io_.restart();
  io_.poll();
  io_.stop();
}

Result<std::unique_ptr<SimServer>> SimServer::build(const SimServerOptions& o) {
  auto engine = engine_config_from(o);
  if (!engine) return engine.error();
  std::unique_ptr<SimServer> s(new SimServer());
  if (o.kv_events_port != 0) s->zmq_.ctx = zmq_ctx_new();
  const std::string name = o.served_model_name.empty()
                               ? (o.model_config.empty() ? o.model : engine->model.name)
                               : o.served_model_name;
  std::uint32_t max_model_len = o.max_model_len.value_or(engine->model.max_position_embeddings);
  if (max_model_len == 0) max_model_len = 32768;
  for (int i = 0; i < o.workers; ++i) {
    SimWorkerConfig wc;
    wc.index = i;
    wc.host = o.host;
    wc.port = static_cast<std::uint16_t>(o.port + i);
    wc.engine = *engine;
    wc.limits.served_model_name = name;
    wc.limits.alias = o.model;
    wc.limits.max_model_len = max_model_len;
    wc.speed = o.speed;
    wc.seed = o.seed;
    wc.max_body_bytes = o.max_body_bytes;
    wc.api_key = o.api_key;
    wc.lora_modules = o.lora_modules;
    wc.idle_timeout_s = o.idle_timeout_s;
    wc.fail_status = o.fail_status;
    wc.hang = o.hang;
    wc.kv_events_encoding = o.kv_events_encoding;
    wc.kv_events_load_interval_s = o.kv_events_load_interval_s;
    wc.kv_events_delay_s = o.kv_events_delay_s;
    wc.zmq_context = s->zmq_.ctx;
    if (o.kv_events_port != 0) {
      const std::string host = zmq_bind_host(o.host);
      wc.kv_events.endpoint = "tcp://" + host + ":" + std::to_string(o.kv_events_port + i);
      wc.kv_events.replay_endpoint = "tcp://" + host + ":" + std::to_string(o.kv_events_replay_port + i);
      wc.kv_events.topic = o.kv_events_topic;
    }
    auto w = SimWorker::create(s->io_, std::move(wc));
    if (!w) return w.error();
    s->workers_.push_back(std::move(*w));
  }
  return s;
}

void SimServer::run() {
  signals_.add(SIGINT);
  signals_.add(SIGTERM);
  signals_.async_wait([this](boost::system::error_code ec, int) {
    if (ec) return;
    for (auto& w : workers_) w->stop();
    io_.stop();
  });
  for (auto& w : workers_) w->start();
  io_.run();
}

void SimServer::stop() {
  boost::asio::post(io_, [this] {
    for (auto& w : workers_) w->stop();
    io_.stop();
  });
}

int run_kv_size(const std::vector<std::string_view>& args) {
  std::string target;
  std::string gpu_name(kDefaultGpu);
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string_view a = args[i];
    if (a == "--gpu" && i + 1 < args.size()) {
      gpu_name = lower(args[++i]);
    } else if (a.starts_with("--gpu=")) {
      gpu_name = lower(a.substr(6));
    } else if (a == "--help" || a == "-h") {
      std::cout << "usage: kvroute-sim kv-size CONFIG.json|MODEL [--gpu NAME]\n";
      return 0;
    } else if (!a.starts_with("--") && target.empty()) {
      target = std::string(a);
    } else {
      std::cerr << "kv-size: unexpected argument '" << a << "'\n";
      return 2;
    }
  }
  if (target.empty()) {
    std::cerr << "usage: kvroute-sim kv-size CONFIG.json|MODEL [--gpu NAME]\n";
    return 2;
  }
  // A path (has a '/' or ends in .json) is a config file; anything else a built-in model name.
  const bool is_file = target.find('/') != std::string::npos || target.ends_with(".json");
  auto model = is_file ? load_model_config(target) : builtin_model(lower(target));
  if (!model) {
    std::cerr << "kv-size: " << model.error().message << "\n";
    return 2;
  }
  auto gpu = builtin_gpu(gpu_name);
  if (!gpu) {
    std::cerr << "kv-size: --gpu: " << gpu.error().message << "\n";
    return 2;
  }
  std::cout << kv_size_report(*model, *gpu);
  return 0;
}

}  // namespace kvroute::sim
