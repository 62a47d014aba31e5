#include "router/api/fanout.h"

#include <boost/asio/post.hpp>

namespace kvroute::router::api {

void fan_out(ClientSession& session, const std::vector<std::shared_ptr<backends::Worker>>& workers,
             const FanoutRequest& req, FanoutReply on_reply) {
  auto reply = std::make_shared<FanoutReply>(std::move(on_reply));
  for (std::size_t i = 0; i < workers.size(); ++i) {
    auto done = [keep = session.keep(), reply, i](Result<backends::SimpleResponse> r) {
      auto ex = keep->executor();
      boost::asio::post(ex, [keep, reply, i, r = std::move(r)]() mutable { (*reply)(i, std::move(r)); });
    };
    if (req.post_body) {
      backends::http_post(session.executor(), workers[i]->endpoint(), req.target, *req.post_body, req.timeout,
                          std::move(done), req.body_limit, req.authorization);
    } else {
      backends::http_get(session.executor(), workers[i]->endpoint(), req.target, req.timeout, std::move(done),
                         req.body_limit, req.authorization);
    }
  }
}

std::vector<std::shared_ptr<backends::Worker>> healthy_workers(const backends::WorkerRegistry& registry) {
  std::vector<std::shared_ptr<backends::Worker>> out;
  const auto workers = registry.snapshot();
  for (const auto& w : *workers) {
    if (w->healthy()) out.push_back(w);
  }
  return out;
}

}  // namespace kvroute::router::api
