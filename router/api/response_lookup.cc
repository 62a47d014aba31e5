// Where a Responses API id this router did not see being made is stored: another router replica (the chart
// runs two) or this one before a restart routed it. Every healthy worker is asked, the one that has it is
// remembered, then the request goes on. Ids that could not be a path segment are not looked up, nor any while
// kMaxResponseLookups are under way.
#include <algorithm>
#include <atomic>
#include <cctype>

#include "router/api/endpoints.h"
#include "router/api/fanout.h"
#include "router/log.h"

namespace kvroute::router::api {

namespace {

// Response id lookups (one GET per worker each) under way at once, over every I/O thread; beyond this a
// request is routed without one, so that a flood of made-up ids cannot multiply into a flood of requests to the
// workers.
constexpr std::size_t kMaxResponseLookups = 64;
std::atomic<std::size_t> response_lookups_in_flight{0};

bool plausible_id(const std::string& id) {
  return !id.empty() && id.size() <= 256 && std::all_of(id.begin(), id.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
  });
}

struct Lookup {
  std::size_t pending = 0;
  bool done = false;
  std::function<void()> then;
};

}  // namespace

void find_response_owner(ClientSession& session, Services& svc, const std::string& id, std::function<void()> then) {
  auto lookup = std::make_shared<Lookup>();
  lookup->then = std::move(then);
  std::vector<std::shared_ptr<backends::Worker>> asked;
  if (plausible_id(id)) asked = healthy_workers(svc.registry);
  lookup->pending = asked.size();
  if (lookup->pending == 0) return lookup->then();
  if (response_lookups_in_flight.fetch_add(1) >= kMaxResponseLookups) {
    --response_lookups_in_flight;
    svc.metrics.response_lookup("skipped");
    return lookup->then();
  }
  FanoutRequest req;
  req.target = "/v1/responses/" + id;
  req.timeout = std::chrono::milliseconds(static_cast<long long>(svc.config.health_timeout_s * 1000));
  req.body_limit = 64u << 20;
  // A client that could not read the response from its worker cannot have it found either.
  req.authorization = std::string(session.request()[http::field::authorization]);
  fan_out(session, asked, req, [&session, &svc, lookup, asked, id](std::size_t i, Result<backends::SimpleResponse> r) {
    const bool found = r && r->status == 200;
    --lookup->pending;
    if (lookup->pending == 0) --response_lookups_in_flight;
    if (lookup->done || (!found && lookup->pending > 0)) return;
    lookup->done = true;
    if (found) svc.router.remember_response(id, asked[i]->id());
    svc.metrics.response_lookup(found ? "found" : "not_found");
    LOG_DEBUG("request " << session.request_id() << ": response " << id
                         << (found ? " is stored on worker " + asked[i]->name() : std::string(" is on no worker")));
    lookup->then();
  });
}

}  // namespace kvroute::router::api
