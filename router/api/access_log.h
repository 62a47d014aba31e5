// The access log (--access-log): one JSON object per answered API request on stdout, with what routed it and
// what the worker reported.
//
//   AccessRecord rec; rec.at = now; ...
//   write_access_log(rec, request, request_id, worker.get(), status);
//   {"time":"...","request_id":"...","method":"POST","path":"/v1/chat/completions","status":200,...}
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "backends/worker_registry.h"
#include "router/http_util.h"
#include "router/router.h"

namespace kvroute::router::api {

struct AccessRecord {
  std::chrono::system_clock::time_point at;  // the request was read
  std::chrono::steady_clock::time_point start;
  bool client_gone = false;  // the client left before the response ended
  std::string_view reason;   // the routing decision's, for prefix-routed requests
  std::uint64_t prompt_tokens = 0, predicted_cached_tokens = 0;
  std::optional<Usage> usage;  // what the worker reported
  double ttft_s = -1;
  int retries = 0;             // other workers the request was sent to after its first failed it
  const char* error = nullptr;  // the error code of a request that failed (router/exchange.h), if one did
  bool stream_cut = false;      // its response was cut after the first byte reached the client
};

// One line (one fwrite, so lines of different threads do not mix). `status` 0: no answer was sent.
void write_access_log(const AccessRecord& rec, const StringRequest& req, const std::string& request_id,
                      const backends::Worker* worker, unsigned status);

}  // namespace kvroute::router::api
