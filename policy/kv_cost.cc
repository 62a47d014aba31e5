// kv_cost: kvroute's own policy (architecture section 7). Every healthy worker is priced in seconds of
// expected latency and the cheapest wins:
//
//   g, c     tokens of the prompt matched on the worker's GPU and CPU tier; m = T - g - c to recompute
//   prefill  = prefill_seconds(m, g + c, P) + c / X   P prefill tokens/s at the reference context, X CPU->GPU
//                                                      tokens/s; attention makes late tokens dearer (see
//                                                      policy/rate_learner.h)
//   queue    = max(pending / P,                      work admitted ahead of this request: at the reference rate,
//                  prefill_seconds(pending, 0, P))     or attention-weighted when so much is pending that a long
//                                                      prompt must be among it
//              at least the sum of the pending requests' own estimates (attention to their cached context
//              included), less the time the worker has spent on them since its last first token at a chunk's
//              share of its step (chunk / P over chunk / P + step), up to the oldest's estimate
//            + ceil((pending' + m) / chunk) x step    each chunked-prefill step also runs the decode batch;
//                                                      step = the worker's decode step at its current batch;
//                                                      pending' = pending scaled as the queue was
//   admit    = wait for admission: beyond the running-sequence cap, (requests over the cap) x out x step / cap
//              (slots free as running requests finish); when the pool's free room, (1 - usage) x pool, is less
//              than the prefill queued ahead plus this request's new tokens and output, the shortfall over what
//              the requests in flight will have allocated, times out x step (they end spread over one turnover,
//              each freeing its own tokens)
//   TTFT     = queue + prefill + admit                 (the estimate session affinity compares)
//   expected = base + queue + prefill + admit'         (the TTFT reported, not compared: Terms::expected)
//   evict    = blocks the request computes x share of the worker's capacity holding blocks that were hit
//              again x recompute time of a block     (a warm cache evicts one block per block computed; in
//              precise mode a predicted block the worker's event confirms counts as hit again, so the share
//              is close to how full the worker's cache is: docs/benchmarks.md, "Counting only real reuse")
//   dup      = prefill time of the tokens some other worker holds but this one would recompute (the copy)
//   r        = the share of the worker's capacity holding blocks that were hit again (as in evict)
//   r/(1-r)  = the recomputes each block of the copy sets off in that cache, the eviction cascade (Terms::cascade;
//              1 when its capacity is unknown)
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
//              the request's effect on each of those means as a share of it (Terms::cost). A mean not known yet
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
// Rent or buy. A request that stays on its prefix's holder, where the cheapest other worker would serve it for less
// if it held the prefix too, pays rent: the difference. The copy that would end the rent costs its premium, that
// worker's price with the copy less its price without. Each prefix (the deepest block any worker holds) keeps an
// account of the rent its requests paid; once the rent reaches the premium, the prefix is bought: the router sends
// that worker the request's prompt alone, for one output token (Pick::warm), while the request itself stays where
// it costs least. Bought on the request's own path, the copy's prefill was that request's TTFT: at light load such
// copies made the p99 (tenants cell at 0.71x the knee: 12 of the 60 slowest requests, p99 +13.4 % over the best
// other policy; +2.2 % with the copy off the path). This is the deterministic ski-rental rule, which never pays more than twice what the
// best choice in hindsight would have (Karlin, Manasse, Rudolph, Sleator, "Competitive snoopy caching",
// Algorithmica 1988). A per-request price never buys on its own a copy whose value is to later requests: a prefix
// every request shares stayed on the few workers that computed it first while the others idled, and every request
// decoded in their batches (family seed 196: mean ITL 2.6x round robin's). Rent accrues only while that worker has
// no prefill queued: a copy made there delays nobody's prefill. The account is the router replica's own; a copy
// made by the cost itself closes it too (docs/benchmarks.md, "The model's own means before the fleet's, and rent or
// buy for a prefix's copy").
//
// What made the difference on the benchmark (docs/benchmarks.md): pricing admission (running cap and full KV pool)
// and the batch-dependent decode step, so sessions and long chats are not stacked on a worker whose TTFT looks fine
// until its pool fills; the duplicate term, so a conversation is not moved off the worker holding its context for a
// small queueing gain; attention-aware prefill times, also for the queue (a request holding a prefix no longer waits
// 14 s behind a 190K prompt the estimate priced at 4 s); the convex TTFT cost; the queue of a worker behind a long
// prefill counted with its progress and its attention to cached context (it keeps conversations with their
// context at high load); and dropping the old "stall
// of the worker's decode batch" term (beta x prefill time of m on any decoding worker), a cliff of several seconds
// between an idle and a busy worker that sent long prompts to idle-decode workers with long prefill queues.
//
// P, X and the step time come from the WorkerView: learned online from completed requests by
// policy::RateLearner, starting from the worker's profile. Blocks a worker evicted are not in the index, so
// they count as recompute, never as hits. Ties (equal cost) go to the worker with fewer requests in flight.
#include "policy/policies.h"
#include "policy/rate_learner.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <unordered_map>

namespace kvroute::policy {
namespace {

// Chunked-prefill token budget per engine step (vLLM's default max_num_batched_tokens for chunked prefill
// on large GPUs is 8192 in V1; smaller budgets only make the decode term larger).
constexpr double kChunkTokens = 8192.0;
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
// opening's tie-break below: 321 of 450 family seeds within every margin against 307, and on draws held out of
// that choice 127 of 200 against 130 (docs/benchmarks.md, "The queue's progress at a chunk's share, and openings
// in turn").

class KvCost final : public RoutingPolicy {
 public:
  explicit KvCost(const PolicyOptions& o) : o_(o) {}
  std::string_view name() const override { return "kv_cost"; }
  bool uses_prefix_match() const override { return true; }
  bool waits_for_computing_prefix() const override { return true; }

  struct Terms {
    double ttft = 0, evict = 0, dup = 0, others = 0;
    // r / (1 - r), r the share of the worker's capacity holding blocks hit again: the recomputes each copied block
    // sets off there (see "The part that prices the copy itself" above); 1 when the capacity is unknown.
    double cascade = 1;
    // The TTFT expected, as reported (Pick::expected_ttft_s), which routing does not compare: `ttft` prices
    // the queue and the admission wait for routing's sake (a margin against overload), and leaves out the
    // fixed part, which every worker has. Here, instead:
    //  - base: the worker's learned fixed part (front end, first step; WorkerView::base_ttft_s); for short
    //    requests it is most of the TTFT (on the benchmark family, estimate + base alone took the median error
    //    of the reported estimate from 26 % to 14 %);
    //  - queue: as routing prices it, the work done on it credited (see "The queue's progress" above);
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
    // `idle_steps` (pick()).
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
    // values) is the model's own estimate of it, from the candidates (pick()), so the same objective holds from
    // the first request.
    double cost(const PolicyOptions& o, double idle_steps, const RoutingContext::FleetMeans& m, double scale) const {
      const double dup_scale = cascade * (1.0 + kDuplicateTailWeight * ttft / scale) + idle_steps;
      const double cache = o.alpha * (evict + dup * dup_scale);
      const double price = ttft * (1.0 + ttft / scale);
      const double per_e2e = m.ttft_s / m.e2e_s, per_itl = m.ttft_s / m.itl_s;
      return price * (1.0 + per_e2e) + per_itl * (own_itl + others_itl) + per_e2e * (out * own_itl + others) +
             cache;
    }
  };

  // `most_matched`: the longest match any healthy worker has for this request (for the duplicate term);
  // `step_per_token`, `empty_step`: the candidates' mean decode-step time per context token and of an empty batch
  // (for the decode terms); 0 and negative: the worker's own. `held`: tokens the worker is priced as holding at
  // least (the rent of pick(): what the request would cost there with a copy of the prefix).
  Terms terms(const RoutingContext& ctx, std::size_t i, double most_matched, double step_per_token = 0,
              double empty_step = -1, double held = 0) const {
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
    Terms t;

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
    t.others = o_.beta * n * out * per_token * (T + out / 2) + n * decoding_share * copy;
    // The same per step: each of the n has its step lengthened by per_token x (T + out / 2) for beta of its
    // steps, and the copy's stall spread over its out steps.
    t.others_itl = o_.beta * n * per_token * (T + out / 2) + n * decoding_share * copy / std::max(out, 1.0);
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

  double estimate(const RoutingContext& ctx, std::size_t i) const override { return terms(ctx, i, 0).ttft; }
  double expected_ttft(const RoutingContext& ctx, std::size_t i) const override { return terms(ctx, i, 0).expected; }
  // The decode step of the worker's batch with this request's context added (prompt and half its output):
  // architecture section 8, a memory-bound step reads every running sequence's KV.
  double itl_estimate(const RoutingContext& ctx, std::size_t i) const override {
    const WorkerView& w = ctx.workers[i];
    const double out = expected_output_tokens(ctx.max_tokens);
    return w.decode_step_s + w.decode_step_per_token_s * (static_cast<double>(ctx.prompt_tokens) + out / 2);
  }

  // Worker w's decode step with an empty batch: its step at its current batch less that batch's context at
  // `per_token` seconds per context token.
  static double empty_batch_step(const WorkerView& w, double per_token) {
    return std::max(0.0, w.decode_step_s - per_token * static_cast<double>(w.active_decode_tokens));
  }

  // Whether worker w's cache has room for `tokens` more without evicting blocks that were hit again (its capacity
  // less its reused blocks); true when its capacity is unknown.
  static bool room_for(const RoutingContext& ctx, const WorkerView& w, double tokens) {
    if (w.capacity_blocks == 0) return true;
    const double tpb = ctx.tokens_per_block > 0 ? ctx.tokens_per_block : 16.0;
    return static_cast<double>(w.reused_blocks) + std::ceil(tokens / tpb) <= static_cast<double>(w.capacity_blocks);
  }

  // Whether worker i has room for the blocks of the `most_matched` prefix it lacks (room_for); true when it holds
  // the prefix.
  static bool copy_fits(const RoutingContext& ctx, std::size_t i, std::uint64_t most_matched) {
    const std::uint64_t matched = ctx.matched_tokens(i);
    return matched >= most_matched || room_for(ctx, ctx.workers[i], static_cast<double>(most_matched - matched));
  }

  // Whether a session may open on a holder of its prefix with `excess` sessions more than the fleet's mean bound
  // there (the least bound holders have `least_held`), rather than copy the `copy`-token prefix elsewhere: when the
  // excess sessions' own contexts take less KV than the copy would, and the holder has room for this session's own
  // context beside the blocks it has that are hit again (as `copy_fits` asks of a copy's target). What a session
  // keeps on its worker alone is its own context, taken at the largest any recent later turn had
  // (RoutingContext::session_context_tokens) less the prefix it opens on: a later turn's own context counts a prefix
  // that only its own worker holds (a document read by that worker's sessions alone) as the session's, while the
  // sessions opened on that prefix hold it once between them. Counted in full, a 94K-token document made every
  // session look larger than the copy, and openings copied the document behind another worker's 95K-token prefill
  // (family seed 173: 14 s first turns, mean TTFT 1.98x cache_aware's; 1.34x since: docs/benchmarks.md, "A
  // session's own context beyond its prefix"). Until later turns are seen there is no excess (agent sessions look
  // small when they open and grow to 128K tokens). The balance in sessions is what keeps growing sessions apart;
  // where sessions share a long document or tool set and add little to it, copying the document for one session
  // more or less costs more KV, prefill and waiting than the sessions' own contexts do. Family seed 39 (nine
  // 32K-token documents, chat): 235 later turns waited behind copies the balance had made (1.6 s each on average),
  // against 35 under e2 (docs/benchmarks.md, "A session opening weighed in KV").
  static bool excess_below_copy(const RoutingContext& ctx, double excess, double copy, std::uint32_t least_held) {
    if (ctx.session_context_tokens <= 0) return false;
    const double own = std::max(ctx.session_context_tokens - copy, 0.0);
    if (excess * own > copy) return false;
    for (std::size_t i = 0; i < ctx.workers.size(); ++i) {
      const WorkerView& w = ctx.workers[i];
      if (!w.healthy || static_cast<double>(ctx.matched_tokens(i)) < copy || w.sessions != least_held) continue;
      if (room_for(ctx, w, own)) return true;
    }
    return false;
  }

  std::optional<Pick> pick(const RoutingContext& ctx) const override {
    // The longest match any healthy worker has (for the duplicate term), the shortest prefill queue, the mean
    // decode-step time per context token, of an empty batch and at the current batches, and the mean requests in
    // flight.
    std::uint64_t most_matched = 0;
    std::uint32_t most_blocks = 0;  // the same match in blocks: its last one names the prefix (rent_or_buy)
    double idle_queue_s = std::numeric_limits<double>::infinity(), step_per_token = 0, empty_step = 0,
           mean_step = 0, mean_in_flight = 0;
    std::size_t healthy = 0;
    for (std::size_t i = 0; i < ctx.workers.size(); ++i) {
      const WorkerView& w = ctx.workers[i];
      if (!w.healthy) continue;
      ++healthy;
      step_per_token += w.decode_step_per_token_s;
      empty_step += empty_batch_step(w, w.decode_step_per_token_s);
      mean_step += std::max(w.decode_step_s, 0.0);
      mean_in_flight += w.in_flight;
      most_matched = std::max(most_matched, ctx.matched_tokens(i));
      most_blocks = std::max(most_blocks, ctx.matched_blocks(i));
      const double queue_s = static_cast<double>(w.pending_prefill_tokens) / std::max(w.prefill_tokens_per_s, 1.0);
      idle_queue_s = std::min(idle_queue_s, queue_s);
    }
    if (healthy > 0) {
      step_per_token /= static_cast<double>(healthy);
      empty_step /= static_cast<double>(healthy);
      mean_step /= static_cast<double>(healthy);
      mean_in_flight /= static_cast<double>(healthy);
    }
    // A session opens on a worker holding the longest prefix of its prompt any worker holds while the least bound
    // of those holders has no more sessions than the fleet's mean: the sessions stay balanced, and a long shared
    // prefix (a document, a tool set) is not computed again for the balance's sake. Otherwise it opens anywhere,
    // unless the holder's excess is smaller, in KV, than the copy: see `excess_below_copy`.
    bool holders_only = false;
    if (ctx.opens_session && most_matched > 0 && healthy > 0) {
      double mean_sessions = 0;
      std::uint32_t least_held = std::numeric_limits<std::uint32_t>::max();
      for (std::size_t i = 0; i < ctx.workers.size(); ++i) {
        if (!ctx.workers[i].healthy) continue;
        mean_sessions += ctx.workers[i].sessions;
        if (ctx.matched_tokens(i) == most_matched) least_held = std::min(least_held, ctx.workers[i].sessions);
      }
      const double excess = static_cast<double>(least_held) - mean_sessions / static_cast<double>(healthy);
      holders_only = excess <= 0 || excess_below_copy(ctx, excess, static_cast<double>(most_matched), least_held);
    }
    // The fleet's means the cost weighs with (Terms::cost), and the convex price's scale, the mean end-to-end latency.
    // A mean not known yet is the model's estimate of it (estimated_means()): over the requests priced so far, this
    // one's included, the mean of what each would have on the candidates (their mean): its expected TTFT, its own
    // inter-token latency at the batch it would join, and its end-to-end latency (that TTFT and its output at that
    // latency). Before, the unknown means gave way to a cost in plain seconds, the others' end-to-end delay weighed
    // one for one against the request's TTFT. With long outputs the means take tens of seconds to become known, and
    // meanwhile a burst piled 17,575 tokens of prefill on the worker with the fewest requests in flight, against
    // 3,672-8,279 on the others (family seed 158: p99 TTFT 1.12x e2's; 1.04x now). With 8 router replicas, each
    // learns its means from its own requests, 8 times later.
    RoutingContext::FleetMeans means = ctx.fleet_means;
    double scale = means.e2e_s;
    if (!means.known() && healthy > 0) {
      double ttft = 0, itl = 0, e2e = 0;
      for (std::size_t i = 0; i < ctx.workers.size(); ++i) {
        if (!ctx.workers[i].healthy) continue;
        const Terms t = terms(ctx, i, static_cast<double>(most_matched), step_per_token, empty_step);
        ttft += t.expected;
        itl += t.own_itl;
        e2e += t.expected + t.out * t.own_itl;
      }
      const double h = static_cast<double>(healthy);
      const RoutingContext::FleetMeans prior = estimated_means(ttft / h, itl / h, e2e / h);
      if (means.ttft_s <= 0) means.ttft_s = std::max(prior.ttft_s, 1e-3);
      if (means.itl_s <= 0) means.itl_s = std::max(prior.itl_s, 1e-4);
      if (means.e2e_s <= 0) means.e2e_s = std::max(prior.e2e_s, 1e-3);
      scale = means.e2e_s;
    }
    // The duplicate term's fleet-busy part: the fleet's shortest prefill queue counted in decode steps. Once even the
    // least-loaded worker has queued prefill, a copy of a prefix another worker holds takes GPU time from requests
    // that are waiting, whichever worker it goes to, so moving a request off its prefix's holder needs a larger TTFT
    // gain, one more for each step the fleet is behind. The step is the engine's unit: chunked prefill hands a
    // worker's compute between its prefill queue and its decode batch one step at a time (architecture section 8).
    // It was a fitted 25 ms (17-33 ms behaved alike: where these workers' steps lie); on the workers' own step the
    // 200 seeds of the workload family judge alike (docs/benchmarks.md, "The fleet-busy price in decode steps").
    const double idle_steps = healthy > 0 && idle_queue_s > 0 ? idle_queue_s / std::max(mean_step, 1e-6) : 0.0;
    // `alt`: the cheapest worker that lacks some of the prefix (the rent, below).
    std::optional<std::size_t> best, alt;
    double best_cost = std::numeric_limits<double>::infinity(), best_ttft = 0, best_expected = 0;
    double alt_cost = std::numeric_limits<double>::infinity();
    bool best_overloaded = false;
    std::optional<std::size_t> holder;  // a session opening: the prefix's cheapest holder (below the loop)
    double holder_cost = std::numeric_limits<double>::infinity(), holder_ttft = 0, holder_expected = 0;
    bool holder_overloaded = false;
    for (std::size_t k = 0; k < ctx.workers.size(); ++k) {
      const std::size_t i = (k + ctx.sequence) % ctx.workers.size();
      const WorkerView& w = ctx.workers[i];
      if (!w.healthy) continue;
      if (holders_only && ctx.matched_tokens(i) != most_matched) continue;
      // A session does not open by copying the prefix into a cache with no room for it beside the blocks there that
      // are hit again: the copy would evict reused blocks (other documents, other sessions' contexts) for the
      // balance's sake, and their next requests would compute them again. Family seed 103 (36 documents of 74K
      // tokens, 85 % of the fleet's KV capacity): openings copied documents 63 times and the evictions ran the fleet
      // into recomputing (mean TTFT 19x e2's; 7x without those copies). The prefix's holders always have room.
      if (ctx.opens_session && !copy_fits(ctx, i, most_matched)) continue;
      const Terms t = terms(ctx, i, static_cast<double>(most_matched), step_per_token, empty_step);
      const double c = t.cost(o_, idle_steps, means, scale);
      if (ctx.matched_tokens(i) < most_matched && c < alt_cost) {
        alt = i;
        alt_cost = c;
      }
      // A request opening a session goes to a worker with the fewest live sessions bound (of the prefix's holders,
      // above), then to the one whose last session opened longest ago, then the cheapest. Its pick binds the
      // session's later turns, whose load is unknown now but alike in expectation for every session, so the
      // sessions themselves are what to spread evenly; the cost of this first turn hardly differs between workers,
      // and picking by it stacked agent sessions whose contexts later grew to 50-128K tokens on a few workers until
      // their KV pools overflowed (docs/benchmarks.md, "Where a session opens"). Between equally bound workers, the
      // one whose sessions are all older holds the sessions likelier to have ended, and a burst of openings goes
      // round the fleet in turn. Requests in flight, the tie-break before, count only the turns under way at that
      // moment (docs/benchmarks.md, "The queue's progress at a chunk's share, and openings in turn").
      // Except that a session does not open where its first turn would wait longer than a typical request takes in
      // all (the convex price's scale, above) and more than the fleet's mean requests are in flight, while another
      // candidate has neither: the balance is for later turns, and it sent openings of 49K-token documents to the
      // least bound holder with 100K tokens queued (16-20 s) when other holders would serve them in 0.3 s (family
      // seed 25; without the in-flight condition, agent sessions stacked on the holders out of the tail instead).
      const bool overloaded = ctx.opens_session && t.ttft > scale && static_cast<double>(w.in_flight) > mean_in_flight;
      if (ctx.opens_session && most_matched > 0 && ctx.matched_tokens(i) == most_matched && c < holder_cost) {
        holder = i;
        holder_cost = c;
        holder_ttft = t.ttft;
        holder_expected = t.expected;
        holder_overloaded = overloaded;
      }
      if (ctx.opens_session && best && overloaded != best_overloaded) {
        if (overloaded) continue;
        best.reset();
      } else if (ctx.opens_session && best) {
        const WorkerView& b = ctx.workers[*best];
        if (w.sessions != b.sessions || w.session_opened_ago_s != b.session_opened_ago_s) {
          if (w.sessions > b.sessions ||
              (w.sessions == b.sessions && w.session_opened_ago_s < b.session_opened_ago_s))
            continue;
          best.reset();
        }
      }
      if (!best || c < best_cost || (c == best_cost && w.in_flight < ctx.workers[*best].in_flight)) {
        best = i;
        best_overloaded = overloaded;
        best_cost = c;
        best_ttft = t.ttft;
        best_expected = t.expected;
      }
    }
    if (!best) return std::nullopt;
    // A session opening that the balance sends to a worker without its prefix (every holder has more sessions bound
    // than the fleet's mean) computes the prefix there on its own path. Where the prefix's cheapest holder would
    // serve this first turn for less, and the balance's worker has no prefill queued, the turn goes to the holder and
    // the session is bound to the balance's worker, its prompt warmed there (Pick::session_worker, Pick::warm): the
    // later turns find the prefix there, and the first one does not wait for the copy. Family seed 86 (5 tenants of
    // 61K tokens, chat, load 0.23): the first sessions' openings each computed 61K tokens (3.4 s) for the balance, p99
    // TTFT 13.7x cache_aware's; 1.05x so (docs/benchmarks.md, "A session's first turn on its prefix's holder").
    std::optional<std::size_t> warm, session_worker;
    if (holder && ctx.matched_tokens(*best) < most_matched && !holder_overloaded && holder_cost < best_cost &&
        ctx.workers[*best].pending_prefill_tokens == 0) {
      session_worker = best;
      warm = best;
      best = holder;
      best_ttft = holder_ttft;
      best_expected = holder_expected;
    }
    // A copy the rent bought is made off any request's path: this request stays where it costs least, and the
    // router sends `alt` the prompt alone (Pick::warm).
    if (most_matched > 0 && !holders_only && !ctx.opens_session &&
        rent_or_buy(ctx, *best, best_cost, alt, alt_cost, most_matched, most_blocks, idle_steps, means, scale,
                    step_per_token, empty_step)) {
      warm = alt;
    }
    const std::uint64_t hit = ctx.matched_tokens(*best);
    Reason reason = Reason::kCold;
    if (hit > 0 && hit == most_matched) reason = Reason::kPrefixHit;
    else if (most_matched > 0) reason = Reason::kLoadFallback;
    return Pick{*best, reason, hit, best_ttft, itl_estimate(ctx, *best), best_expected, warm, session_worker};
  }

 private:
  // The means of the estimates (TTFT, own inter-token latency, end-to-end latency, each the candidates' mean for its
  // request) of the requests this policy has priced before the fleet's means were known, this one's included: the
  // fleet's means as the model predicts them. Not what it expected at the workers it picked: that made the estimate
  // follow its own picks (family seed 103, 36 documents of 74K tokens: mean TTFT 9.2x e2's against 2.7x).
  RoutingContext::FleetMeans estimated_means(double ttft, double itl, double e2e) const {
    std::lock_guard<std::mutex> lock(state_mu_);
    estimated_.ttft_s += ttft;
    estimated_.itl_s += itl;
    estimated_.e2e_s += e2e;
    const double n = static_cast<double>(++estimated_count_);
    return {estimated_.ttft_s / n, estimated_.itl_s / n, estimated_.e2e_s / n};
  }

  // The rent of pick(), header comment: the request's pick `best` at `best_cost`; `alt`, the cheapest worker lacking
  // some of the `most_matched` prefix (`most_blocks` blocks), at `alt_cost`. True when the copy there is bought.
  bool rent_or_buy(const RoutingContext& ctx, std::size_t best, double best_cost, std::optional<std::size_t> alt,
                   double alt_cost, std::uint64_t most_matched, std::uint32_t most_blocks, double idle_steps,
                   const RoutingContext::FleetMeans& means, double scale, double step_per_token,
                   double empty_step) const {
    if (!ctx.chain || most_blocks == 0 || most_blocks > ctx.chain->hashes.size()) return false;
    const std::uint64_t prefix = ctx.chain->hashes[most_blocks - 1];
    if (ctx.matched_tokens(best) < most_matched) {  // the pick copies the prefix itself
      std::lock_guard<std::mutex> lock(state_mu_);
      rent_.erase(prefix);
      return false;
    }
    if (!alt || ctx.workers[*alt].pending_prefill_tokens > 0) return false;
    const double mm = static_cast<double>(most_matched);
    const double warm = terms(ctx, *alt, mm, step_per_token, empty_step, mm).cost(o_, idle_steps, means, scale);
    const double rent = best_cost - warm;
    if (rent <= 0) return false;
    std::lock_guard<std::mutex> lock(state_mu_);
    if (rent_.size() >= kRentAccounts && !rent_.count(prefix)) rent_.clear();
    double& paid = rent_[prefix];
    paid += rent;
    if (paid < alt_cost - warm) return false;
    rent_.erase(prefix);
    return true;
  }

  // Accounts kept at most (a prefix each, ~50 bytes): beyond, they start over, which only delays copies.
  static constexpr std::size_t kRentAccounts = 65536;

  PolicyOptions o_;
  mutable std::mutex state_mu_;
  mutable std::unordered_map<std::uint64_t, double> rent_;  // prefix -> rent its requests paid (guarded by state_mu_)
  mutable RoutingContext::FleetMeans estimated_;  // sums for estimated_means() (guarded by state_mu_)
  mutable std::uint64_t estimated_count_ = 0;     // guarded by state_mu_
};

}  // namespace

std::unique_ptr<RoutingPolicy> make_kv_cost(const PolicyOptions& options) {
  return std::make_unique<KvCost>(options);
}

}  // namespace kvroute::policy
