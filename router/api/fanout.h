// One request to several workers at once, for the endpoints that speak for the whole fleet: the /v1/models
// merge, LoRA adapter updates, and the search for the worker that stores a response id. Each reply comes back
// on the client connection's thread, with the session kept alive until the last one.
//
//   FanoutRequest req{.target = "/v1/models", .timeout = 5s, .body_limit = 4 << 20, .authorization = auth};
//   fan_out(session, healthy_workers(registry), req, [state](std::size_t i, Result<SimpleResponse> r) {...});
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backends/upstream.h"
#include "backends/worker_registry.h"
#include "router/client_session.h"

namespace kvroute::router::api {

struct FanoutRequest {
  std::optional<std::string> post_body;  // POST this JSON body; GET without one
  std::string target;
  std::chrono::milliseconds timeout{5000};
  std::size_t body_limit = 4u << 20;
  // The client's own credentials: workers with an API key answer /v1 routes only to clients that have it.
  std::string authorization;
};

using FanoutReply = std::function<void(std::size_t index, Result<backends::SimpleResponse> reply)>;

// Sends `req` to each of `workers` on a fresh connection; `on_reply` runs once per worker, on the session's
// thread, with the worker's index in `workers`.
void fan_out(ClientSession& session, const std::vector<std::shared_ptr<backends::Worker>>& workers,
             const FanoutRequest& req, FanoutReply on_reply);

// The workers to ask in a fan-out, read once: a worker whose health changes meanwhile must not be counted in
// one pass and skipped in another, or the fan-out never completes.
std::vector<std::shared_ptr<backends::Worker>> healthy_workers(const backends::WorkerRegistry& registry);

}  // namespace kvroute::router::api
