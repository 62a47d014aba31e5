// ApiHandler: the OpenAI-compatible API's answer to each request a ClientSession reads. It picks the endpoint
// by path and method and runs it:
//   /health, /ready                              here
//   /v1/chat/completions, /v1/completions,
//   /v1/responses (routed inference)             router/api/inference.cc: parse, tokenize, Router::route, hold
//   /v1/models                                   router/api/models.cc: every worker's list, merged
//   /v1/load_lora_adapter, /v1/unload_...        router/api/lora.cc: to every worker
//   /v1/responses/ID...                          router/api/passthrough.cc, to the worker that stores it
//                                                (router/api/response_lookup.cc finds it when unknown)
//   any other /v1/* and inference root routes    router/api/passthrough.cc: to the least loaded worker
// Before any of them but /health and /ready (router/api/guard.cc): the client's API key when --api-keys-file
// is given (401 without a valid one; the key's tenant becomes the request's), then admission control
// (--max-concurrent-requests: the request waits for a slot, fairly across tenants, or gets 429).
// A routed or passed-through request goes to its worker through the connection's Exchange; what the relay
// reads (router/relay_observer.h) goes to Router::complete() when the exchange ends (finish()). A worker that
// refuses the connection is taken out of rotation and the request, not yet sent, routed again; a routed request
// a worker failed before its first byte goes to another worker (router/api/failover.cc).
//
// One per client connection, owned by its ClientSession, on the session's thread. Its member functions are
// defined in the files named above, by endpoint.
//
//   auto session = std::make_shared<ClientSession>(std::move(socket), options);
//   session->run(std::make_unique<api::ApiHandler>(*session, services));
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/steady_timer.hpp>

#include "router/api/access_log.h"
#include "router/client_session.h"
#include "router/exchange.h"
#include "router/relay_observer.h"
#include "router/services.h"

namespace kvroute::router::api {

class ApiHandler final : public RequestHandler, public ExchangeEvents {
 public:
  ApiHandler(ClientSession& session, Services& svc);

  // ---- RequestHandler ----
  void on_request() override;
  bool cancellable() const override { return exchange_.active() || held_for_prefix() || queued_ != 0; }
  void on_client_gone() override;
  void on_request_end() override;
  void on_close() override { exchange_.cancel_timers(); }

  // ---- ExchangeEvents ----
  void on_connect_failed(boost::beast::error_code ec) override;
  void on_exchange_failed(const ExchangeFailure& failure) override;
  void on_relayed(bool reusable) override;
  void on_client_write_failed() override { on_client_gone(); }
  bool may_retry() override { return retry_possible(); }

 private:
  using Clock = std::chrono::steady_clock;
  void handle_api(std::string_view path);
  void dispatch(std::string_view path);

  // ---- authentication and admission (guard.cc) ----
  // The request's key is valid (or none is needed): its tenant replaces the client's tenant header, and the
  // key is not forwarded. Else answers 401 and returns false.
  bool authenticate();
  // Runs dispatch() once the request holds a slot, or answers 429.
  void admit();
  void on_admitted(std::uint64_t id);
  void on_queue_timeout(std::uint64_t id);
  void leave_queue();
  void release_slot();

  // ---- routed inference (inference.cc) ----
  void handle_routed(Endpoint endpoint);
  bool want_tokenize() const;
  void prepare_route(RoutableRequest parsed, Clock::time_point t0);
  void on_tokenized(RoutableRequest request, Clock::time_point t0, Result<backends::SimpleResponse> r);
  // Routes now, or, when replicas take turns in a burst (Router::stagger_s), after this replica's turn.
  void take_turn(RoutableRequest parsed, Clock::time_point t0);
  void route_parsed(RoutableRequest parsed, Clock::time_point t0);
  void route_again();
  void wait_for_prefix();
  void on_hold_wake(std::uint64_t seq);
  void end_hold();
  bool held_for_prefix() const { return decision_ && decision_->hold_leader != 0; }
  // The decision in the access log; and its warm-up, when the pick bought one (router/warm_up.h), sent.
  void note_decision();

  // ---- failover (failover.cc) ----
  bool retry_possible();
  bool retry_elsewhere(const ExchangeFailure& failure);
  void forget_predicted_prefix();

  // ---- passed through (passthrough.cc) ----
  void handle_passthrough(std::string_view path);
  void forward_to_response_owner(const std::string& id);
  void forward_to_owner(hashing::WorkerId owner);
  void forward_to_least_loaded();

  // ---- the exchange (api_handler.cc) ----
  void forward(std::shared_ptr<backends::Worker> worker);
  void finish(bool ok, bool reusable, bool worker_failed = true);

  ClientSession& session_;
  Services& svc_;
  const bool access_log_;  // not svc_: the session's destructor writes the last line after the Services are gone
  AccessRecord access_;
  std::shared_ptr<backends::Worker> worker_;  // the worker of the last exchange, for the access log
  std::optional<Decision> decision_;
  std::optional<RoutableRequest> routable_;  // the routed request, for routing it again (on_connect_failed)
  std::string passthrough_model_;            // the model a passed-through request names, if any
  std::string up_body_;                      // the routed request's body as rewritten for the worker, if it was
  bool strip_usage_ = false;                 // ... with an include_usage the client did not ask for
  int reroutes_ = 0;
  std::vector<hashing::WorkerId> tried_;  // workers that failed the routed request (not routed to again)
  std::optional<boost::asio::steady_timer> hold_timer_;  // a prefix hold's checks, or a replica's turn
  std::uint64_t hold_seq_ = 0;                           // the latest wake-up or check of a prefix hold
  HoldWaiters::Id hold_watch_ = 0;                       // its watch in the router (Router::watch_prefix_hold)
  std::shared_ptr<Admission> admission_;  // svc_.admission, held: a slot may be released after the Services are gone
  std::string tenant_;                    // the request's tenant, for admission
  bool admitted_ = false;                 // the request holds a slot
  std::uint64_t queued_ = 0;              // its place in the queue while it waits for one
  std::optional<boost::asio::steady_timer> queue_timer_;  // --queue-timeout
  RelayObserver observer_;
  Exchange exchange_;
};

}  // namespace kvroute::router::api
