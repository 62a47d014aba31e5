#include "router/api/access_log.h"

#include <cstdio>

#include <boost/json.hpp>

#include "router/log.h"

namespace kvroute::router::api {

namespace json = boost::json;

void write_access_log(const AccessRecord& rec, const StringRequest& req, const std::string& request_id,
                      const backends::Worker* worker, unsigned status) {
  json::object o;
  o["time"] = log::timestamp(rec.at);
  o["request_id"] = request_id;
  o["method"] = req.method_string();
  o["path"] = target_path(req.target());
  o["status"] = status;
  if (rec.client_gone) o["client_gone"] = true;
  // What the client got, whatever the status line said: a stream cut after its 200 head is no success.
  o["outcome"] = rec.stream_cut ? "stream_cut" : rec.client_gone ? "client_gone" : status >= 200 && status < 400 ? "ok" : "error";
  if (rec.error) o["error"] = rec.error;
  if (rec.retries > 0) o["retries"] = rec.retries;
  if (worker) o["worker"] = worker->name();
  if (!rec.reason.empty()) {
    o["reason"] = rec.reason;
    o["predicted_cached_tokens"] = rec.predicted_cached_tokens;
  }
  if (rec.usage) {
    o["prompt_tokens"] = rec.usage->prompt_tokens;
    o["cached_tokens"] = rec.usage->cached_tokens;
    o["completion_tokens"] = rec.usage->completion_tokens;
  } else if (rec.prompt_tokens > 0) {
    o["prompt_tokens"] = rec.prompt_tokens;  // the router's estimate: the worker reported none
  }
  if (rec.ttft_s >= 0) o["ttft_s"] = rec.ttft_s;
  o["duration_s"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - rec.start).count();
  std::string line = json::serialize(o);
  line.push_back('\n');
  std::fwrite(line.data(), 1, line.size(), stdout);
}

}  // namespace kvroute::router::api
