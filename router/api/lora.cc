// POST /v1/load_lora_adapter, /v1/unload_lora_adapter. An adapter is loaded on (or unloaded from) the fleet,
// not one worker: the request goes to every healthy worker, with the client's credentials, and each one that
// answers has its /v1/models read again before the answer, so requests naming the adapter go to the workers
// that have it from the next request on (not from the next 30 s refresh). When every worker accepted it, or
// every one refused it, the answer is the first worker's; when only some refused, it is the first refusal's
// status, with what each one answered.
#include <set>

#include <boost/asio/post.hpp>

#include "router/api/endpoints.h"
#include "router/api/fanout.h"
#include "util/split.h"

namespace kvroute::router::api {

namespace {

struct LoraFanout {
  std::vector<std::shared_ptr<backends::Worker>> asked;
  std::vector<std::optional<Result<backends::SimpleResponse>>> replies;  // set as the workers answer
  std::size_t pending = 0;  // replies and /v1/models re-reads still to come
};

Error unknown_worker(std::string_view name, const std::vector<std::shared_ptr<backends::Worker>>& workers) {
  std::string known;
  for (const auto& w : workers) known += (known.empty() ? "" : ", ") + w->name();
  return make_error("x-kvroute-workers names no worker called '" + std::string(name) + "' (workers: " + known + ")",
                    400, "invalid_request_error", "unknown_worker");
}

// The workers a comma-separated list names (by the names /admin/workers shows, or their URLs); an error naming
// what matches no worker.
Result<std::set<hashing::WorkerId>> chosen_workers(const backends::WorkerRegistry& registry, std::string_view list) {
  std::set<hashing::WorkerId> out;
  const auto workers = registry.snapshot();
  for (std::string_view name : split(list, ',')) {
    while (!name.empty() && name.front() == ' ') name.remove_prefix(1);
    while (!name.empty() && name.back() == ' ') name.remove_suffix(1);
    if (name.empty()) continue;
    bool found = false;
    for (const auto& w : *workers) {
      if (w->name() == name || w->endpoint().url == name) {
        out.insert(w->id());
        found = true;
      }
    }
    if (!found) return unknown_worker(name, *workers);
  }
  if (out.empty()) return make_error("x-kvroute-workers names no worker", 400, "invalid_request_error", "unknown_worker");
  return out;
}

void answer_lora_update(ClientSession& session, const LoraFanout& st) {
  std::size_t succeeded = 0;
  std::optional<std::size_t> first_ok, first_refusal;
  std::string detail;
  for (std::size_t k = 0; k < st.replies.size(); ++k) {
    const auto& reply = *st.replies[k];
    const bool good = reply && reply->status >= 200 && reply->status < 300;
    if (good) {
      ++succeeded;
      if (!first_ok) first_ok = k;
      continue;
    }
    if (!first_refusal) first_refusal = k;
    detail += "; " + st.asked[k]->name() + " " +
              (reply ? "answered " + std::to_string(reply->status) + ": " + reply->body.substr(0, 300)
                     : reply.error().message);
  }
  if (succeeded == st.replies.size() || (!first_ok && *st.replies[*first_refusal])) {
    // All accepted, or all refused: the first worker's answer.
    const auto& reply = **st.replies[first_ok ? *first_ok : *first_refusal];
    auto res = std::make_shared<StringResponse>();
    res->result(static_cast<http::status>(reply.status));
    res->version(11);
    if (!reply.content_type.empty()) res->set(http::field::content_type, reply.content_type);
    res->body() = reply.body;
    return session.answer(res);
  }
  const auto& refusal = *st.replies[*first_refusal];
  const unsigned status = refusal ? refusal->status : 502;
  session.answer_error(make_error(std::to_string(succeeded) + " of " + std::to_string(st.replies.size()) +
                                      " workers accepted it" + detail,
                                  status >= 400 && status < 600 ? status : 502, "upstream_error", "partial_failure"));
}

void on_lora_reply(ClientSession& session, Services& svc, const std::shared_ptr<LoraFanout>& st, std::size_t i,
                   Result<backends::SimpleResponse> r) {
  // Any worker that answered is read again: one that refused may still have changed (or had the adapter).
  const bool answered = static_cast<bool>(r);
  st->replies[i] = std::move(r);
  if (answered && svc.refresh_models) {
    ++st->pending;
    svc.refresh_models(st->asked[i]->id(), [keep = session.keep(), st] {
      boost::asio::post(keep->executor(), [keep, st] {
        if (--st->pending == 0) answer_lora_update(*keep, *st);
      });
    });
  }
  if (--st->pending == 0) answer_lora_update(session, *st);
}

}  // namespace

void serve_lora_update(ClientSession& session, Services& svc, std::string path) {
  const StringRequest& req = session.request();
  auto state = std::make_shared<LoraFanout>();
  state->asked = healthy_workers(svc.registry);
  // x-kvroute-workers: NAME[,NAME...] places (or removes) the adapter on those workers only.
  if (const std::string_view only = req["x-kvroute-workers"]; !only.empty()) {
    auto chosen = chosen_workers(svc.registry, only);
    if (!chosen) return session.answer_error(chosen.error());
    std::erase_if(state->asked, [&](const auto& w) { return !chosen->contains(w->id()); });
  }
  if (state->asked.empty()) return session.answer_error(no_healthy_worker());
  state->replies.resize(state->asked.size());
  state->pending = state->asked.size();
  FanoutRequest fanout;
  fanout.post_body = req.body();
  fanout.target = std::move(path);
  fanout.timeout = std::chrono::milliseconds(static_cast<long long>(svc.config.request_timeout_s * 1000));
  fanout.body_limit = 64u << 10;
  fanout.authorization = std::string(req[http::field::authorization]);
  fan_out(session, state->asked, fanout, [&session, &svc, state](std::size_t i, Result<backends::SimpleResponse> r) {
    on_lora_reply(session, svc, state, i, std::move(r));
  });
}

}  // namespace kvroute::router::api
