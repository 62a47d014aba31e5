// kv_cost: kvroute's own policy (architecture section 7). Every healthy worker is priced in seconds of expected latency
// (policy/kv_cost_price.h; the model, term by term, in policy/kv_cost_price.cc) and the cheapest wins. Ties (equal
// cost) go to the worker with fewer requests in flight.
//
// Rent or buy. A request that stays on its prefix's holder, where the cheapest other worker would serve it for less if
// it held the prefix too, pays rent: the difference. The copy that would end the rent costs its premium, that worker's
// price with the copy less its price without. Each prefix (the deepest block any worker holds) keeps an account of the
// rent its requests paid; once the rent reaches the premium, the prefix is bought: the router sends that worker the
// request's prompt alone, for one output token (Pick::warm), while the request itself stays where it costs least.
// Bought on the request's own path, the copy's prefill was that request's TTFT: at light load such copies made the p99
// (tenants cell at 0.71x the knee: 12 of the 60 slowest requests, p99 +13.4 % over the best other policy; +2.2 % with
// the copy off the path). This is the deterministic ski-rental rule, which never pays more than twice what the best
// choice in hindsight would have (Karlin, Manasse, Rudolph, Sleator, "Competitive snoopy caching", Algorithmica 1988).
// A per-request price never buys on its own a copy whose value is to later requests: a prefix every request shares
// stayed on the few workers that computed it first while the others idled, and every request decoded in their batches
// (family seed 196: mean ITL 2.6x round robin's). Rent accrues only while that worker has no prefill queued: a copy
// made there delays nobody's prefill. The account is the router replica's own; a copy made by the cost itself closes it
// too (docs/benchmarks.md, "The model's own means before the fleet's, and rent or buy for a prefix's copy").
//
// What made the difference on the benchmark (docs/benchmarks.md): pricing admission (running cap and full KV pool) and
// the batch-dependent decode step, so sessions and long chats are not stacked on a worker whose TTFT looks fine until
// its pool fills; the duplicate term, so a conversation is not moved off the worker holding its context for a small
// queueing gain; attention-aware prefill times, also for the queue (a request holding a prefix no longer waits 14 s
// behind a 190K prompt the estimate priced at 4 s); the convex TTFT cost; the queue of a worker behind a long prefill
// counted with its progress and its attention to cached context (it keeps conversations with their context at high
// load); and dropping the old "stall of the worker's decode batch" term (beta x prefill time of m on any decoding
// worker), a cliff of several seconds between an idle and a busy worker that sent long prompts to idle-decode workers
// with long prefill queues.
#include "policy/kv_cost_price.h"
#include "policy/policies.h"
#include "policy/rate_learner.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <unordered_map>

namespace kvroute::policy {
namespace {

class KvCost final : public RoutingPolicy {
 public:
  explicit KvCost(const PolicyOptions& o) : o_(o) {}
  std::string_view name() const override { return "kv_cost"; }
  bool uses_prefix_match() const override { return true; }
  bool waits_for_computing_prefix() const override { return true; }

  double estimate(const RoutingContext& ctx, std::size_t i) const override {
    return kv_cost_terms(ctx, i, o_.beta, 0).ttft;
  }
  double expected_ttft(const RoutingContext& ctx, std::size_t i) const override {
    return kv_cost_terms(ctx, i, o_.beta, 0).expected;
  }
  // The decode step of the worker's batch with this request's context added (prompt and half its output):
  // architecture section 8, a memory-bound step reads every running sequence's KV.
  double itl_estimate(const RoutingContext& ctx, std::size_t i) const override {
    const WorkerView& w = ctx.workers[i];
    const double out = expected_output_tokens(ctx.max_tokens);
    return w.decode_step_s + w.decode_step_per_token_s * (static_cast<double>(ctx.prompt_tokens) + out / 2);
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
      idle_queue_s = std::min(idle_queue_s, queued_prefill_seconds(w));
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
    // The fleet's means the cost weighs with (KvCostTerms::cost), and the convex price's scale, the mean end-to-end
    // latency.
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
        const KvCostTerms t =
            kv_cost_terms(ctx, i, o_.beta, static_cast<double>(most_matched), step_per_token, empty_step);
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
    std::optional<std::size_t> cheapest;  // a session opening: the cheapest candidate, the balance aside (below the loop)
    double cheapest_cost = std::numeric_limits<double>::infinity(), cheapest_ttft = 0, cheapest_expected = 0;
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
      const KvCostTerms t =
          kv_cost_terms(ctx, i, o_.beta, static_cast<double>(most_matched), step_per_token, empty_step);
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
      if (ctx.opens_session && c < cheapest_cost) {
        cheapest = i;
        cheapest_cost = c;
        cheapest_ttft = t.ttft;
        cheapest_expected = t.expected;
      }
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
    // A session opening whose first turn the balance's worker would serve later than the cheapest candidate by more
    // than the fleet's mean TTFT, while some worker has no prefill queued, is served by the cheapest, and the session
    // stays bound to the balance's worker (Pick::session_worker), with no warm-up: its second turn computes there
    // what the first would have. The balance is for the later turns, and its wait put the first ones in the fleet's
    // tail: family seed 389 (46 documents of 91K tokens, chat sessions, bursts) p99 TTFT 2.78x e2's -> 0.90x, seed 398
    // 8.98x -> 3.85x (docs/benchmarks.md). Only while the fleet has room to spare (`idle_queue_s`, above): once
    // every worker has a queue, the first turn takes a place in another one and its second turn computes it again
    // (the saturated multi_turn cell at 1.6x its knee: mean TTFT 0.72 -> 0.86 s without this condition). The
    // threshold is the fleet's own mean, learned. Measured alternatives (warming the balance's worker too, no
    // threshold, others): docs/benchmarks.md, "A session's first turn where it is served soonest".
    if (ctx.opens_session && !session_worker && cheapest && *cheapest != *best && idle_queue_s <= 0 &&
        cheapest_ttft + means.ttft_s < best_ttft) {
      session_worker = best;
      best = cheapest;
      best_ttft = cheapest_ttft;
      best_expected = cheapest_expected;
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
    const double warm =
        kv_cost_terms(ctx, *alt, o_.beta, mm, step_per_token, empty_step, mm).cost(o_, idle_steps, means, scale);
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
