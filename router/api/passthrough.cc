// Routes passed through to one worker as they are (no prefix routing): any /v1/* route the router does not
// serve itself, and the inference routes vLLM and SGLang serve outside /v1/. A stored response (GET, DELETE,
// cancel, input_items of /v1/responses/ID) goes to the worker that made it; anything else to the least loaded
// healthy worker that serves the model the body names.
#include "router/api/api_handler.h"
#include "router/api/endpoints.h"

namespace kvroute::router::api {

void ApiHandler::handle_passthrough(std::string_view path) {
  decision_.reset();
  reroutes_ = 0;
  strip_usage_ = false;
  up_body_.clear();
  passthrough_model_ = top_level_model(session_.request().body());
  if (path.starts_with("/v1/responses/")) {
    const std::string_view rest = path.substr(std::string_view("/v1/responses/").size());
    std::string id(rest.substr(0, rest.find('/')));
    observer_.watch_background(id, rest.substr(id.size()), session_.request().method());
    if (const auto owner = svc_.router.response_owner(id)) return forward_to_owner(*owner);
    return find_response_owner(session_, svc_, id,
                               [this, keep = session_.keep(), id] { forward_to_response_owner(id); });
  }
  forward_to_least_loaded();
}

void ApiHandler::forward_to_response_owner(const std::string& id) {
  if (const auto owner = svc_.router.response_owner(id)) return forward_to_owner(*owner);
  forward_to_least_loaded();
}

// To the worker that stores a response; when it is gone or unhealthy, as any passed-through route (the worker
// that gets it answers that it has no such response).
void ApiHandler::forward_to_owner(hashing::WorkerId owner) {
  if (auto worker = svc_.registry.find(owner); worker && worker->healthy()) return forward(std::move(worker));
  forward_to_least_loaded();
}

void ApiHandler::forward_to_least_loaded() {
  auto worker = svc_.router.any_healthy(passthrough_model_);
  if (!worker) return session_.answer_error(no_healthy_worker());
  forward(std::move(worker));
}

}  // namespace kvroute::router::api
