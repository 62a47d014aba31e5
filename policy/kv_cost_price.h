// kv_cost's price of one request on one worker: the parts of its latency there, what it costs the requests
// already there and the cache, and the cost that weighs them (the model and where each part comes from:
// policy/kv_cost_price.cc). policy/kv_cost.cc picks the worker with it.
//
//   const KvCostTerms t = kv_cost_terms(ctx, i, options.beta, most_matched, step_per_token, empty_step);
//   const double c = t.cost(options, idle_steps, fleet_means, scale);
#pragma once

#include <cstddef>

#include "policy/routing_policy.h"

namespace kvroute::policy {

struct KvCostTerms {
  double ttft = 0, evict = 0, dup = 0, others = 0;
  // r / (1 - r), r the share of the worker's capacity holding blocks hit again: the recomputes each copied block
  // sets off there (policy/kv_cost_price.cc, "The part that prices the copy itself"); 1 when the capacity is
  // unknown.
  double cascade = 1;
  // The TTFT expected, as reported (Pick::expected_ttft_s), which routing does not compare: `ttft` prices
  // the queue and the admission wait for routing's sake (a margin against overload), and leaves out the
  // fixed part, which every worker has. Here, instead:
  //  - base: the worker's learned fixed part (front end, first step; WorkerView::base_ttft_s); for short
  //    requests it is most of the TTFT (on the benchmark family, estimate + base alone took the median error
  //    of the reported estimate from 26 % to 14 %);
  //  - queue: as routing prices it, the work done on it credited (policy/kv_cost_price.cc, "The queue's
  //    progress");
  //  - admit': when the pool lacks room for the request (kv_room_shortfall), the engine's waiting line
  //    (WorkerView::waiting) drains as running requests finish, running / (out x step) per second (Little's
  //    law, with this request's output as the typical one), so this request waits (waiting + 1) x out x step
  //    / running; with nobody waiting it is admitted at once. The routing term (then the pool's turnover for
  //    the tokens queued ahead, from 90 % usage) had observed / estimated from 0.2 to 9 (10th-90th percentile)
  //    there: 0.85 without waiting, 2.4 with.
  double expected = 0;
  // Convex in TTFT (ttft x (1 + ttft / E), see cost()): a second of queueing costs more the longer the request
  // already takes, so long prompts, which set the p99, go where they start soonest, while for short requests
  // the cache terms still decide. The duplicate term scales with the eviction cascade in the worker's cache
  // (`cascade`) and TTFT (kDuplicateTailWeight), and with the fleet's shortest prefill queue in decode steps,
  // `idle_steps` (KvCost::pick()).
  // The decode side, in seconds: `others` what the request adds to the end-to-end latency of the requests in
  // flight there, `others_itl` to their inter-token latencies (summed over them), `own_itl` the request's own
  // inter-token latency at the batch it joins. Weighed by the fleet's means (see cost()).
  double others_itl = 0, own_itl = 0, out = 0;
  // The cost weighs the request's effect on each mean users see, as a share of that mean: a second of TTFT
  // moves the fleet's mean TTFT by 1 / N seconds, N requests, which is (1 / N) / TTFT-mean of it, and its mean
  // end-to-end latency by (1 / N) / E2E-mean; a second more of inter-token latency, on this request or summed
  // over others, moves the mean ITL by (1 / N) / ITL-mean; the request's decode (out x own_itl) and the others'
  // delay move the mean end-to-end latency. Scaled by N x TTFT-mean to stay in seconds of TTFT:
  //   TTFT-price x (1 + T/E) + (T/I) x (own_itl + others_itl) + (T/E) x (out x own_itl + others)
  // with T, I, E the fleet's recent means (RoutingContext::fleet_means). The weights are the figures' own
  // scales, learned online; no weight is fitted. The TTFT price is convex on the scale of E, the fleet's mean
  // end-to-end latency: a second of waiting costs 1 + 2 ttft / E, three times as much once the wait alone is as
  // long as a typical request takes in all (`scale`). A mean not known yet (fewer than kKnownMeanValues
  // values) is the model's own estimate of it, from the candidates (KvCost::pick()), so the same objective holds
  // from the first request.
  double cost(const PolicyOptions& o, double idle_steps, const RoutingContext::FleetMeans& m,
              double scale) const;
};

// The price of sending the request of `ctx` to worker i of ctx.workers. `beta`: the share of this request's decode
// a request running there overlaps (PolicyOptions::beta). `most_matched`: the longest match any healthy worker has
// for this request (for the duplicate term); `step_per_token`, `empty_step`: the candidates' mean decode-step time
// per context token and of an empty batch (for the decode terms); 0 and negative: the worker's own. `held`: tokens
// the worker is priced as holding at least (the rent of KvCost::pick(): what the request would cost there with a
// copy of the prefix).
KvCostTerms kv_cost_terms(const RoutingContext& ctx, std::size_t i, double beta, double most_matched,
                          double step_per_token = 0, double empty_step = -1, double held = 0);

// Worker w's decode step with an empty batch: its step at its current batch less that batch's context at
// `per_token` seconds per context token.
double empty_batch_step(const WorkerView& w, double per_token);

}  // namespace kvroute::policy
