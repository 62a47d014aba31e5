// The API endpoints that speak for the whole fleet rather than one worker, each answering one request of a
// ClientSession (router/api/api_handler.h dispatches to them):
//   serve_models        GET /v1/models: every healthy worker's list, merged (router/api/models.cc)
//   serve_lora_update   POST /v1/load_lora_adapter, /v1/unload_lora_adapter: to every worker (lora.cc)
//   find_response_owner which worker stores a Responses API id this router did not see made
//                       (response_lookup.cc)
//
//   if (path == "/v1/models") return serve_models(session, svc);
#pragma once

#include <functional>
#include <string>

#include "router/client_session.h"
#include "router/services.h"

namespace kvroute::router::api {

void serve_models(ClientSession& session, Services& svc);
void serve_lora_update(ClientSession& session, Services& svc, std::string path);
// Asks every healthy worker for response `id` (GET /v1/responses/ID; a worker that does not store it answers
// 404), remembers the one that has it (Router::remember_response), then runs `then` on the session's thread.
void find_response_owner(ClientSession& session, Services& svc, const std::string& id, std::function<void()> then);

}  // namespace kvroute::router::api
