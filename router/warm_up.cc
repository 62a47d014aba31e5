#include "router/warm_up.h"

#include <chrono>
#include <utility>

#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <boost/json/value.hpp>

#include "backends/upstream.h"
#include "router/log.h"

namespace kvroute::router {

namespace json = boost::json;

Result<std::string> warm_up_body(std::string_view body) {
  boost::system::error_code ec;
  json::value v = json::parse(body, ec);
  if (ec || !v.is_object()) return make_error("a warm-up needs a JSON object body");
  json::object& o = v.as_object();
  for (const char* field : {"max_completion_tokens", "min_tokens", "stream_options", "n", "best_of", "logprobs",
                            "top_logprobs", "prompt_logprobs"}) {
    o.erase(field);
  }
  o["max_tokens"] = 1;
  o["stream"] = false;
  return json::serialize(v);
}

void send_warm_up(Services& svc, const boost::asio::any_io_executor& ex, std::shared_ptr<Decision> d,
                  std::string target, std::string_view body) {
  Router& router = svc.router;
  auto warm = warm_up_body(body);
  if (!warm) {
    router.warm_up_done(*d, /*answered=*/false);
    return;
  }
  const auto timeout = std::chrono::milliseconds(static_cast<long long>(svc.config.request_timeout_s * 1000));
  const auto endpoint = d->worker->endpoint();
  backends::http_post(
      ex, endpoint, std::move(target), std::move(*warm), timeout,
      [&router, d](Result<backends::SimpleResponse> r) {
        const bool answered = r && r->status >= 200 && r->status < 300;
        if (!answered) {
          LOG_DEBUG("warm-up on " << d->worker->name() << " failed: "
                                  << (r ? "HTTP " + std::to_string(r->status) : r.error().message));
        }
        router.warm_up_done(*d, answered);
      },
      /*body_limit=*/1 << 20, svc.config.worker_authorization());
}

}  // namespace kvroute::router
