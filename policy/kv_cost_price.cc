// kv_cost's price (policy/kv_cost_price.h): every healthy worker is priced in seconds of expected latency, and
// kv_cost (policy/kv_cost.cc, architecture section 7) sends the request where the cost is least:
//
//   g, c     tokens of the prompt matched on the worker's GPU and CPU tier; m = T - g - c to recompute
//   prefill  = prefill_seconds(m, g + c, P) + c / X   P prefill tokens/s at the reference context, X CPU->GPU
//                                                      tokens/s; attention makes late tokens dearer (see
//                                                      policy/rate_learner.h)
//   queue    = max(pending / P, S) - credit          work admitted ahead of this request: its tokens at the
//                                                      reference rate, or S, the pending requests' own estimates
//                                                      summed (each with its attention to its cached context),
//                                                      when more; credit = the time the worker has spent on them
//                                                      since its last first token at a chunk's share of its step
//                                                      (chunk / P over chunk / P + step), at most the oldest's
//                                                      estimate
//            + ceil((pending' + m) / chunk) x step    each chunked-prefill step also runs the decode batch;
//                                                      step = the worker's decode step at its current batch;
//                                                      pending' = pending scaled as the queue was
//   admit    = wait for admission: beyond the running-sequence cap, (requests over the cap) x out x step / cap
//              (slots free as running requests finish); when the pool's free room, (1 - usage) x pool, is less
//              than the prefill queued ahead plus this request's new tokens and output, the shortfall over what
//              the requests in flight will have allocated, times out x step (they end spread over one turnover,
//              each freeing its own tokens)
//   TTFT     = queue + prefill + admit                 (the estimate session affinity compares)
//   expected = base + queue + prefill + admit'         (the TTFT reported, not compared: KvCostTerms::expected)
//   evict    = blocks the request computes x share of the worker's capacity holding blocks that were hit
//              again x recompute time of a block     (a warm cache evicts one block per block computed; in
//              precise mode a predicted block the worker's event confirms counts as hit again, so the share
//              is close to how full the worker's cache is: docs/benchmarks.md, "Counting only real reuse")
//   dup      = prefill time of the tokens some other worker holds but this one would recompute (the copy)
//   r        = the share of the worker's capacity holding blocks that were hit again (as in evict)
//   r/(1-r)  = the recomputes each block of the copy sets off in that cache, the eviction cascade
//              (KvCostTerms::cascade; 1 when its capacity is unknown)
//   idle     = the fleet's spare prefill: the shortest prefill queue (pending / P) of any healthy worker
//   others   = beta x n x out x d                     what the request adds to the inter-token latency of the
//                                                      n requests in flight there: d = step_per_token x (T +
//                                                      out / 2) per step (architecture section 8: a memory-bound
//                                                      step reads every running sequence's KV), for the part of
//                                                      its out steps each of them is still decoding (beta)
//            + n x s x copy                          the copy's prefill (the tokens some other worker holds,
//                                                      recomputed here) delays each of them still decoding then,
//                                                      s = max(0, 1 - queue / (out x step)) of the n
//   others'  = the same per step: beta x n x d + n x s x copy / out     (summed over the n's inter-token latencies)
//   own      = step0 + step_per_token x max(decoding context + T + out / 2, (n + 1) x (T + out / 2))
//                                                      this request's own inter-token latency at the batch it
//                                                      joins; step0 and step_per_token the candidates' means
//   cost     = TTFT x (1 + TTFT / Em) x (1 + Tm / Em) + (Tm / Im) x (own + others')
//              + (Tm / Em) x (out x own + others)
//              + alpha x (evict + dup x (r / (1 - r) x (1 + 2 TTFT / Em) + idle / step))
//              Tm, Im, Em: the means of the fleet's recent TTFT, inter-token and end-to-end latency; the cost is
//              the request's effect on each of those means as a share of it (KvCostTerms::cost). A mean not known yet
//              is the model's estimate of it: over the requests priced so far, the mean of the candidates'
//              expected TTFT, own inter-token latency, and expected TTFT + out x own; step the candidates' mean
//              decode step at their current batches
//
// The TTFT part of the cost is convex: a second of queueing costs 1 + 2 TTFT / Em, so a prompt whose wait alone
// would be as long as a typical request's whole latency (a long prompt behind a long queue, which sets the
// p99) goes where it starts soonest, while for short requests the cache terms (evict, dup) still decide. This is
// a tail-aware objective, not a workload rule, and its scale is the fleet's own, learned online (it was a fitted
// 5 s, with a separate price for prompts of 24K tokens or more waiting past the fleet's p97 TTFT; both went
// together: docs/benchmarks.md, "The convex price on the fleet's own scale"). The duplicate term grows with the
// TTFT the request would have on the worker too (kDuplicateTailWeight): without that, the convex TTFT cost moved
// long prompts off a busy worker holding part of their prefix for small gains, and the copies they made evicted
// other prefixes (conversation trace at 1x the knee: hit rate 12.7 % -> 13.2 %).
// It grows with the load of the whole fleet as well (idle / step): a recomputation is paid for with GPU time, which
// is free while some worker idles and taken from other requests once every worker has a queue.
// The part that prices the copy itself, the cache space it takes, is the eviction cascade it sets off. A copy's
// blocks are a prefix that requests share, so they stay in the cache the way a finished request's own tail does
// not (engines evict that first); each of them displaces the least recently used block, which with probability r
// is hit again and computed anew, displacing another in turn: r + r^2 + ... = r / (1 - r) recomputes of a block per
// block copied, at most the cache's blocks. A cache holding nothing reused takes a copy for its prefill (in TTFT)
// and, on a busy fleet, the GPU time; where a prefix every request shares is held by a few busy workers, idle
// workers with cold caches take copies at once (family seeds 7, 17, 65, 76: docs/benchmarks.md, "The duplicate's
// price, in proportion to reuse"). It replaced a fitted weight, 5 x r (docs/benchmarks.md, "The copy's price as
// the eviction cascade it sets off").
//
// P, X and the step time come from the WorkerView: learned online from completed requests by
// policy::RateLearner, starting from the worker's profile. Blocks a worker evicted are not in the index, so
// they count as recompute, never as hits.
#include "policy/kv_cost_price.h"

#include <algorithm>
#include <cmath>

#include "policy/rate_learner.h"

namespace kvroute::policy {
namespace {

// The duplicate term is multiplied by 1 + kDuplicateTailWeight x TTFT / Em (TTFT on the worker
// priced), so leaving a prefix's holder costs more the longer the request takes: a second of the copy's prefill
// is priced as a second of this request's wait at the margin, the derivative of the convex TTFT price
// ttft x (1 + ttft / Em), 1 + 2 ttft / Em; a long prompt is moved off its prefix only for a proportionally larger
// gain. It was a fitted 4 (docs/benchmarks.md, "The duplicate's tail weight from the convex price").
constexpr double kDuplicateTailWeight = 2.0;
// The queue's progress. The router counts a pending request's uncached tokens in full until its first token,
// however much of it is done, so it overstates a busy worker's queue: on the conversation trace at 1.25x the knee,
// requests sent to a worker with 8K-128K tokens pending had a median real TTFT of 0.36-0.45 x kv_cost's estimate
// (docs/benchmarks.md, "Tried since", eighth round). The queue is at least the sum of the pending requests' own
// estimates (a prefill after 100K cached tokens costs far more than its token count says), less the work done on
// it since the worker's last first token, at most the oldest one's estimate. That time is the engine's, and the
// queue model charges each chunk of kChunkTokens its prefill, kChunkTokens / P, plus one decode step while requests
// decode there (architecture section 8: the step that carries a chunk also decodes the batch); so the time since
// is credited at a chunk's share of its step, (kChunkTokens / P) / (kChunkTokens / P + step), to the prefill, and
// the steps the credited tokens no longer need go with it. It replaced a fitted gate and share (credit only behind
// prefills of 1 s or more, and then half), which kept the generators' cells as they were tuned. With the session
// opening's tie-break (policy/kv_cost.cc): 321 of 450 family seeds within every margin against 307, and on draws
// held out of that choice 127 of 200 against 130 (docs/benchmarks.md, "The queue's progress at a chunk's share, and
// openings in turn").

}  // namespace

double KvCostTerms::cost(const PolicyOptions& o, double idle_steps, const RoutingContext::FleetMeans& m,
                         double scale) const {
  const double dup_scale = cascade * (1.0 + kDuplicateTailWeight * ttft / scale) + idle_steps;
  const double cache = o.alpha * (evict + dup * dup_scale);
  const double price = ttft * (1.0 + ttft / scale);
  const double per_e2e = m.ttft_s / m.e2e_s, per_itl = m.ttft_s / m.itl_s;
  return price * (1.0 + per_e2e) + per_itl * (own_itl + others_itl) + per_e2e * (out * own_itl + others) +
         cache;
}

KvCostTerms kv_cost_terms(const RoutingContext& ctx, std::size_t i, double beta, double most_matched,
                          double step_per_token, double empty_step, double held) {
  const WorkerView& w = ctx.workers[i];
  const double tpb = ctx.tokens_per_block > 0 ? ctx.tokens_per_block : 16.0;
  const double P = std::max(w.prefill_tokens_per_s, 1.0);
  const double X = std::max(w.transfer_tokens_per_s, 1.0);
  const double T = static_cast<double>(ctx.prompt_tokens);
  const double matched = std::max(held, static_cast<double>(ctx.matched_tokens(i)));
  const double c = std::min(matched, ctx.matched_cpu_blocks(i) * tpb);
  const double m = std::max(0.0, T - matched);
  const double out = expected_output_tokens(ctx.max_tokens);
  const double step = std::max(w.decode_step_s, 0.0);
  const double pending = static_cast<double>(w.pending_prefill_tokens);
  const bool decoding = w.active_decode_tokens > 0 || w.running > 0;
  KvCostTerms t;

  const double prefill = prefill_seconds(m, T - m, P) + c / X;
  // Pending prefill at the reference rate, or the pending requests' own estimates when more (pending_prefill_s:
  // each priced with its attention when it was sent, so a queued 190K prompt takes 24 s, not 190K / P = 7 s).
  // Not the queue's tokens priced as one prompt: five queued 20K-token prompts are not one 100K-token prompt,
  // whose attention costs twice as much (family seed 233, a burst: estimates of 5.7 s for first tokens that came
  // in 2.3 s; docs/benchmarks.md, "The queue's requests priced one by one").
  const double plain = pending / P;
  double queued = plain;
  if (plain > 0) {
    const double chunk = kChunkTokens / P;
    const double share = decoding ? chunk / (chunk + step) : 1.0;
    const double credit = std::min(share * w.prefill_elapsed_s, w.oldest_prefill_s);
    queued = std::max(0.0, std::max(plain, w.pending_prefill_s) - credit);
  }
  const double pending_left = plain > 0 ? pending * std::min(1.0, queued / plain) : 0.0;
  const double steps = std::ceil((pending_left + m) / kChunkTokens);
  const double queue = queued + (decoding ? steps * step : 0.0);
  double admit = 0.0;
  const double cap = static_cast<double>(std::max<std::uint32_t>(w.max_running, 1));
  const double excess = static_cast<double>(w.in_flight) + 1.0 - cap;
  if (excess > 0) admit = excess * out * step / cap;
  double admit_expected = admit;
  // The pool's room: the request holds its new tokens and its output by its end, after the prefill queued ahead.
  // What the pool lacks for that is freed as the requests in flight end, each freeing the tokens it allocated
  // (inflight_kv_tokens; the prefixes they share stay cached), their ends spread over one turnover, out x step.
  const double shortfall = kv_room_shortfall(w, tpb, m + out);
  if (shortfall > 0) {
    const double used = w.kv_usage * static_cast<double>(w.capacity_blocks) * tpb;
    const double freed = std::max(std::min(used, static_cast<double>(w.inflight_kv_tokens)), 1.0);
    admit = std::max(admit, std::min(1.0, shortfall / freed) * out * step);
    if (w.waiting > 0) {
      const double line = static_cast<double>(w.waiting) + 1.0;
      admit_expected = std::max(admit_expected, line * out * step / std::max<double>(w.running, 1.0));
    }
  }
  t.ttft = queue + prefill + admit;
  t.expected = std::max(w.base_ttft_s, 0.0) + queue + prefill + admit_expected;

  if (w.capacity_blocks > 0) {
    const double capacity = static_cast<double>(w.capacity_blocks);
    const double reused = std::min(static_cast<double>(w.reused_blocks), capacity);
    t.evict = std::ceil(m / tpb) * (reused / capacity) * tpb / P;
    t.cascade = reused < capacity ? std::min(reused / (capacity - reused), capacity) : capacity;
  }
  // The copy: prefill seconds of the tokens some other worker holds but this one would recompute.
  const double copy = most_matched > matched ? prefill_seconds(most_matched - matched, matched, P) : 0.0;
  t.dup = copy;
  // Seconds of others' latency, weighed against this request's TTFT by the fleet's means (cost()). The requests'
  // n is the router's own count, immediate (between two metric polls the reported `running` lags), or what the
  // worker reports if more (requests another router sent). beta: a request running there is on average half way
  // through its decode, so it shares min(its remaining steps, out) ~ out / 2 of this request's steps
  // (PolicyOptions::beta). The request's own decode is priced at the batch it joins now (own_itl); priced in
  // seconds of TTFT at weights 0.1-1, without the means, it lost seeds of the workload family
  // (docs/benchmarks.md, "What a request costs the others"; "Each mean by its own scale").
  // The time a context token adds to a step is the candidates' mean: it is the model's KV bytes over the
  // GPUs' bandwidth, alike across one model's workers, while each router replica's per-worker value differs
  // with the completions it happened to learn from, and with 8 replicas those differences moved requests off
  // their prefix holders (shared_prefix: hit rate 0.953x one router's, with the mean 0.996x).
  const double n = static_cast<double>(std::max<std::uint32_t>(w.in_flight, w.running));
  const double per_token = step_per_token > 0 ? step_per_token : w.decode_step_per_token_s;
  // The copy's compute is taken from the requests decoding there: chunked prefill runs each chunk in the step
  // that decodes them, and a chunk's step is compute-bound (architecture section 8), so each request still
  // decoding when the copy is prefilled waits as long as the copy takes. Still decoding: of the n, the share whose
  // remaining decode outlasts the queue ahead of the copy, remaining decodes spread evenly over [0, out x step]
  // (this request's output as the typical one). Only the copy is priced so: the prompt's own new tokens are
  // prefilled wherever it goes, and pricing their stall too made kv_cost balance requests in flight at the price
  // of p99 TTFT where no prefix is shared (docs/benchmarks.md, "What a copy takes from the requests decoding").
  const double decoding_share = std::max(0.0, 1.0 - queue / std::max(out * step, 1e-9));
  t.others = beta * n * out * per_token * (T + out / 2) + n * decoding_share * copy;
  // The same per step: each of the n has its step lengthened by per_token x (T + out / 2) for beta of its
  // steps, and the copy's stall spread over its out steps.
  t.others_itl = beta * n * per_token * (T + out / 2) + n * decoding_share * copy / std::max(out, 1.0);
  // This request's own step: an empty batch's step plus the context of the batch it joins. Both per-step times
  // are the candidates' means, as above: a worker's own learned values differ with the completions it happened
  // to see, and one never tried keeps its prior (a 20 ms step where the others learned 5 ms) and would look too
  // slow to be tried (RouterE2E.NoWorkerStarvesUnderMixedLoad). The router counts the context of requests
  // decoding there (active_decode_tokens) only from their first token, so a burst sent there since looks free;
  // the n in flight are counted at least as this request's context each (the typical one, as above), so that a
  // burst does not herd onto the worker whose last arrivals are still in prefill.
  const double active = static_cast<double>(w.active_decode_tokens);
  const double empty = empty_step >= 0 ? empty_step : empty_batch_step(w, per_token);
  const double context = T + out / 2;
  t.own_itl = empty + per_token * std::max(active + context, (n + 1) * context);
  t.out = out;
  return t;
}

double empty_batch_step(const WorkerView& w, double per_token) {
  return std::max(0.0, w.decode_step_s - per_token * static_cast<double>(w.active_decode_tokens));
}

}  // namespace kvroute::policy
