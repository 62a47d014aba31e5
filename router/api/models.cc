// GET /v1/models: the models of every healthy worker, merged into one list (each id once, in the order the
// workers answered).
#include <algorithm>

#include <boost/json.hpp>

#include "router/api/endpoints.h"
#include "router/api/fanout.h"

namespace kvroute::router::api {

namespace json = boost::json;

namespace {

struct ModelsFanout {
  std::size_t pending = 0;
  int answered = 0;  // workers that listed their models (200)
  json::array data;
  std::vector<std::string> seen;
  std::optional<backends::SimpleResponse> refused;  // a 401 or 403, passed on if no worker answered 200
};

void merge_models(ModelsFanout& st, const std::string& body) {
  boost::system::error_code ec;
  json::value v = json::parse(body, ec);
  if (ec || !v.is_object()) return;
  const auto* d = v.get_object().if_contains("data");
  if (!d || !d->is_array()) return;
  for (const auto& m : d->get_array()) {
    const auto* mo = m.if_object();
    const auto* id = mo ? mo->if_contains("id") : nullptr;
    if (!id || !id->is_string()) continue;
    std::string s(id->get_string());
    if (std::find(st.seen.begin(), st.seen.end(), s) != st.seen.end()) continue;
    st.seen.push_back(s);
    st.data.push_back(m);
  }
}

void on_models_reply(ClientSession& session, ModelsFanout& st, Result<backends::SimpleResponse> r) {
  if (r && (r->status == 401 || r->status == 403) && !st.refused) st.refused = std::move(*r);
  if (r && r->status == 200) {
    ++st.answered;
    merge_models(st, r->body);
  }
  if (--st.pending > 0) return;
  if (st.answered == 0 && st.refused) {
    // Every worker that answered refused the client's credentials: so does the router.
    return session.answer_json(st.refused->status, std::move(st.refused->body));
  }
  json::object out;
  out["object"] = "list";
  out["data"] = std::move(st.data);
  session.answer_json(200, json::serialize(out));
}

}  // namespace

void serve_models(ClientSession& session, Services& svc) {
  const auto workers = healthy_workers(svc.registry);
  if (workers.empty()) return session.answer_error(no_healthy_worker());
  auto state = std::make_shared<ModelsFanout>();
  state->pending = workers.size();
  FanoutRequest req;
  req.target = "/v1/models";
  req.authorization = std::string(session.request()[http::field::authorization]);
  fan_out(session, workers, req, [&session, state](std::size_t, Result<backends::SimpleResponse> r) {
    on_models_reply(session, *state, std::move(r));
  });
}

}  // namespace kvroute::router::api
