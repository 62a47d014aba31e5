// The admin API's routes, each a synchronous function of the request that returns the whole answer:
//   GET  /metrics                         Prometheus text
//   GET  /health
//   GET  /admin/workers                   every worker, its load, learned rates, and the fleet's cache pools
//   POST /admin/workers                   add a worker: {"url": ..., "kv_events": ..., "model": ..., "dp_size": N}
//   GET  /admin/workers/NAME/blocks       the blocks the router believes the worker holds
//   POST /admin/workers/NAME/cordon       out of rotation for new requests (/uncordon: back)
//   DELETE /admin/workers/NAME
// Served on the admin listener only (router/admin/admin_session.h), never on the API's.
//
//   auto res = admin::serve(request, services);   // then Server and x-request-id, and write it
#pragma once

#include <memory>

#include "router/http_util.h"
#include "router/services.h"

namespace kvroute::router::admin {

std::shared_ptr<StringResponse> serve(const StringRequest& req, Services& svc);

}  // namespace kvroute::router::admin
