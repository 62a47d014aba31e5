#include "router/admin/admin_api.h"

#include <boost/json.hpp>

#include "router/log.h"
#include "router/replica_sync.h"

namespace kvroute::router::admin {

namespace json = boost::json;
using Response = std::shared_ptr<StringResponse>;

namespace {

constexpr std::string_view kWorkersPrefix = "/admin/workers/";

Error no_worker_named(const std::string& name) {
  return make_error("no worker named '" + name + "'", 404, "invalid_request_error", "not_found");
}

Response metrics_page(Services& svc) {
  auto res = std::make_shared<StringResponse>(http::status::ok, 11);
  res->set(http::field::content_type, "text/plain; version=0.0.4");
  if (svc.bodies) svc.metrics.set_held_body_bytes(svc.bodies->held.load(std::memory_order_relaxed));
  svc.router.background_held();  // lets go of those past --request-timeout, and sets the gauge
  svc.router.publish_sessions();  // idle bindings expire at their TTL, between requests too
  res->body() = svc.metrics.serialize();
  return res;
}

json::object worker_json(Services& svc, const backends::Worker& w) {
  const auto t = w.telemetry();
  json::object o;
  o["id"] = w.id();
  o["name"] = w.name();
  o["url"] = w.endpoint().url;
  o["healthy"] = w.healthy();
  o["cordoned"] = w.cordoned();
  // Passive outlier detection (backends/outlier_detector.h).
  const auto now = std::chrono::steady_clock::now();
  o["ejected"] = w.ejected(now);
  if (w.ejected(now)) {
    const auto left = w.ejected_until() - now;
    o["ejected_until"] = log::timestamp(std::chrono::system_clock::now() +
                                        std::chrono::duration_cast<std::chrono::system_clock::duration>(left));
    o["ejected_for_s"] = std::chrono::duration<double>(left).count();
  }
  o["ejections"] = w.ejections();
  o["consecutive_failures"] = w.consecutive_failures();
  o["in_flight"] = w.in_flight();
  // Requests that ended there, sent by this replica and by the others (--shared-state): what dates "running".
  o["requests_ended"] = w.ended_here();
  o["requests_ended_other_replicas"] = w.others_ended();
  o["sessions"] = svc.router.sessions_bound(w.id());
  json::array models;
  for (const auto& m : w.models()) models.emplace_back(m);
  o["models"] = std::move(models);
  o["indexed_blocks"] = svc.router.index().worker_blocks(w.id());
  o["reused_blocks"] = svc.router.index().worker_reused_blocks(w.id());
  o["mode"] = w.precise() ? "precise" : "approximate";
  o["prefix_commit"] = svc.router.prefix_commit(w.id());
  const auto rates = svc.router.learned_rates(w.id());
  o["prefill_tokens_per_s"] = rates.prefill_tokens_per_s;
  o["decode_step_s"] = rates.decode_step_s * rates.decode_correction;
  o["rate_samples"] = rates.prefill_samples;
  if (svc.describe_events) svc.describe_events(w.id(), o);
  if (t.valid) {
    o["running"] = t.running;
    o["waiting"] = t.waiting;
    o["kv_usage"] = t.kv_usage;
    o["num_gpu_blocks"] = t.num_gpu_blocks;
  }
  return o;
}

// The fleet's cache efficiency since start (docs/operations.md, "Cache efficiency"): the fleet's totals, then
// each pool of workers that can hold the same blocks (router/cache_pools.h).
json::object shared_cache_json(Services& svc) {
  const auto& pools = svc.router.cache_pools();
  const auto [hits_workers, hits_shared] = svc.metrics.fleet_cache_hits();
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
  return sc;
}

// Whether this replica shares state with the others (--shared-state), and how that is going.
void add_shared_state(Services& svc, json::object& out) {
  if (auto s = svc.router.shared_state_status()) {
    out["shared_state"] = shared_state_json(*s);
  } else {
    out["shared_state"] = json::object{{"enabled", false}};
  }
}

// GET /admin/status: the replica as a whole (policy, sessions, shared state); /admin/workers adds each worker.
Response status(Services& svc) {
  json::object out;
  out["policy"] = std::string(svc.router.policy().name());
  out["sessions"] = svc.router.session_count();
  out["index_entries"] = svc.router.index().entries();
  add_shared_state(svc, out);
  return json_response(200, json::serialize(out));
}

Response list_workers(Services& svc) {
  json::array arr;
  const auto workers = svc.registry.snapshot();
  for (const auto& w : *workers) arr.push_back(worker_json(svc, *w));
  json::object out;
  out["policy"] = std::string(svc.router.policy().name());
  out["workers"] = std::move(arr);
  out["sessions"] = svc.router.session_count();
  out["index_entries"] = svc.router.index().entries();
  out["shared_cache"] = shared_cache_json(svc);
  add_shared_state(svc, out);
  return json_response(200, json::serialize(out));
}

// The attributes of a --worker flag, by their YAML names, all but url optional.
Result<backends::WorkerEndpoint> parse_worker(const std::string& body) {
  boost::system::error_code ec;
  json::value v = json::parse(body, ec);
  const json::object* o = ec ? nullptr : v.if_object();
  const json::value* url = o ? o->if_contains("url") : nullptr;
  if (!url || !url->is_string()) {
    return make_error("body must be {\"url\": \"http://HOST:PORT\"} (optional: kv_events, kv_events_replay, model, "
                      "dp_size)",
                      400, "invalid_request_error", "invalid_value");
  }
  auto ep = backends::parse_worker_url(url->get_string());
  if (!ep) return ep.error();
  for (const auto& [key, value] : *o) {
    std::string* field = key == "kv_events"          ? &ep->kv_events_endpoint
                         : key == "kv_events_replay" ? &ep->kv_events_replay
                         : key == "model"            ? &ep->model
                                                     : nullptr;
    if (field) {
      if (!value.is_string()) {
        return make_error("'" + std::string(key) + "' must be a string", 400, "invalid_request_error", "invalid_type");
      }
      *field = value.get_string();
    } else if (key == "dp_size") {
      if (!value.is_int64() || value.get_int64() < 1 || value.get_int64() > 1024) {
        return make_error("'dp_size' must be an integer from 1 to 1024", 400, "invalid_request_error", "invalid_value");
      }
      ep->dp_size = static_cast<std::uint32_t>(value.get_int64());
    } else if (key != "url") {
      return make_error("unknown worker attribute '" + std::string(key) +
                            "' (url, kv_events, kv_events_replay, model, dp_size)",
                        400, "invalid_request_error", "invalid_value");
    }
  }
  return ep;
}

Response add_worker(const StringRequest& req, Services& svc) {
  auto ep = parse_worker(req.body());
  if (!ep) return error_response(ep.error());
  auto id = svc.registry.add(*ep);
  if (!id) return error_response(make_error(id.error().message, 409, "invalid_request_error", "conflict"));
  LOG_INFO("worker " << ep->name << " added through the admin API");
  return json_response(201, "{\"id\":" + std::to_string(*id) + "}");
}

// The blocks the router believes a worker holds, in kvroute's own hash space (docs/hashing.md), as decimal
// strings of the unsigned 64-bit hashes (JSON numbers lose precision above 2^53).
Response worker_blocks(Services& svc, const std::string& name) {
  const auto w = svc.registry.find_by_name(name);
  if (!w) return error_response(no_worker_named(name));
  json::array gpu, cpu, predicted;
  for (const auto& [h, tier] : svc.router.index().worker_entries(w->id())) {
    auto& arr = tier == hashing::Tier::kGpu ? gpu : tier == hashing::Tier::kCpu ? cpu : predicted;
    arr.emplace_back(std::to_string(h));
  }
  json::object out;
  out["worker"] = w->name();
  out["mode"] = w->precise() ? "precise" : "approximate";
  out["gpu"] = std::move(gpu);
  out["cpu"] = std::move(cpu);
  out["predicted"] = std::move(predicted);
  return json_response(200, json::serialize(out));
}

// Takes a worker out of rotation for new requests, or puts it back; requests in flight are not touched.
Response cordon(Services& svc, const std::string& name, bool cordon) {
  const auto w = svc.registry.find_by_name(name);
  if (!w) return error_response(no_worker_named(name));
  w->set_cordoned(cordon);
  if (auto s = svc.metrics.worker(w->id())) s->cordoned->Set(cordon ? 1 : 0);
  LOG_INFO("worker " << w->name() << (cordon ? " cordoned" : " uncordoned") << " through the admin API ("
                     << w->in_flight() << " requests in flight)");
  return json_response(200, std::string("{\"worker\":") + json::serialize(json::value(w->name())) +
                                ",\"cordoned\":" + (cordon ? "true" : "false") +
                                ",\"in_flight\":" + std::to_string(w->in_flight()) + "}");
}

Response remove_worker(Services& svc, const std::string& name) {
  const auto w = svc.registry.find_by_name(name);
  if (!w) return error_response(no_worker_named(name));
  svc.registry.remove(w->id());  // the app's listener drops its pooled connections on every thread
  LOG_INFO("worker " << w->name() << " removed through the admin API");
  return json_response(200, R"({"removed":true})");
}

// /admin/workers/NAME/...: the worker's name, or nothing when `path` does not end in `suffix`.
std::optional<std::string> worker_name(std::string_view path, std::string_view suffix) {
  if (!path.starts_with(kWorkersPrefix) || !path.ends_with(suffix)) return std::nullopt;
  return std::string(path.substr(kWorkersPrefix.size(), path.size() - kWorkersPrefix.size() - suffix.size()));
}

}  // namespace

Response serve(const StringRequest& req, Services& svc) {
  const std::string_view path = target_path(req.target());
  const auto method = req.method();
  if (path == "/metrics") return metrics_page(svc);
  if (path == "/health") return json_response(200, R"({"status":"ok"})");
  if (path == "/admin/status" && method == http::verb::get) return status(svc);
  if (path == "/admin/workers" && method == http::verb::get) return list_workers(svc);
  if (path == "/admin/workers" && method == http::verb::post) return add_worker(req, svc);
  if (method == http::verb::get) {
    if (auto name = worker_name(path, "/blocks")) return worker_blocks(svc, *name);
  }
  if (method == http::verb::post) {
    if (auto name = worker_name(path, "/cordon")) return cordon(svc, *name, true);
    if (auto name = worker_name(path, "/uncordon")) return cordon(svc, *name, false);
  }
  if (method == http::verb::delete_) {
    if (auto name = worker_name(path, "")) return remove_worker(svc, *name);
  }
  return error_response(no_route(req.method_string(), path));
}

}  // namespace kvroute::router::admin
