// Warm-ups: kv_cost's bought copy of a prefix (policy::Pick::warm, policy/kv_cost.cc) made off any request's
// path. Router::route() commits it beside the request's own decision (Decision::warm_up); the handler sends
// it here: the second worker gets the request's own body for one output token, not streamed, and the answer is
// dropped. The worker prefills the prompt and keeps its blocks in its prefix cache, as vLLM's and SGLang's
// automatic prefix caching keep any request's, so the prefix's next requests find it there. The body keeps the
// request's cache_salt: the copy stays in the tenant's namespace on the worker.
//
//   if (d.warm_up) send_warm_up(svc, executor, d.warm_up, "/v1/chat/completions", request_body);
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <boost/asio/any_io_executor.hpp>

#include "router/router.h"
#include "router/services.h"
#include "util/result.h"

namespace kvroute::router {

// The warm-up's body for a chat or completions request `body` (a JSON object): the same with max_tokens 1 and
// stream false, and without what would make the worker do more than prefill and one token (max_completion_tokens,
// min_tokens, stream_options, n, best_of, logprobs, top_logprobs, prompt_logprobs). An error for a body that is
// not a JSON object.
Result<std::string> warm_up_body(std::string_view body);

// POSTs the warm-up of `body` to `target` on d's worker, within --request-timeout, and ends it when the worker has
// answered or failed (Router::warm_up_done, kvroute_warm_ups_total). Nothing reaches any client.
void send_warm_up(Services& svc, const boost::asio::any_io_executor& ex, std::shared_ptr<Decision> d,
                  std::string target, std::string_view body);

}  // namespace kvroute::router
