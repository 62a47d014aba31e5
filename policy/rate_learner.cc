#include "policy/rate_learner.h"

#include <algorithm>
#include <cmath>

namespace kvroute::policy {

RateLearner::State& RateLearner::state(WorkerId w) {
  if (w >= workers_.size()) workers_.resize(static_cast<std::size_t>(w) + 1);
  return workers_[w];
}

void RateLearner::set_prior(WorkerId worker, const WorkerRates& prior) {
  std::lock_guard lock(mu_);
  State& s = state(worker);
  s.prior = prior;
  s.now = prior;
  s.now.prefill_samples = s.now.decode_samples = 0;
  s.known = true;
}

void RateLearner::observe(WorkerId worker, const RateObservation& obs) {
  std::lock_guard lock(mu_);
  State& s = state(worker);
  if (!s.known) {
    s.known = true;
    s.now = s.prior;
  }
  const double a = o_.alpha;
  auto ema = [a](double& v, double sample) { v += a * (sample - v); };
  const double service = obs.ttft_s - std::max(0.0, obs.queue_s);
  if (obs.uncached_tokens < o_.min_uncached_tokens / 4 && obs.cpu_tokens == 0 && service > 0) {
    // Little to compute: what remains is the fixed part of TTFT.
    ema(s.now.base_ttft_s, std::min(service, 4.0 * std::max(s.now.base_ttft_s, 1e-3)));
  } else if (obs.uncached_tokens >= o_.min_uncached_tokens && obs.queue_s <= o_.max_queue_for_prefill_s) {
    // Only requests that had (almost) nothing queued ahead: the router's queue estimate counts the head of the
    // queue in full although it is partly computed, so subtracting it overstates P, by ~30 % at load.
    const double cpu_s = static_cast<double>(obs.cpu_tokens) / std::max(s.now.transfer_tokens_per_s, 1.0);
    const double compute_s = service - s.now.base_ttft_s - cpu_s;
    const double p0 = s.prior.prefill_tokens_per_s;
    // prefill_seconds is linear in 1/P: the rate that explains compute_s is its value at P = 1 over compute_s.
    const double work = prefill_seconds(static_cast<double>(obs.uncached_tokens),
                                        static_cast<double>(obs.cached_tokens), 1.0);
    double sample = compute_s > 0 ? work / compute_s : p0 * o_.clamp;
    sample = std::clamp(sample, p0 / o_.clamp, p0 * o_.clamp);
    if (s.now.prefill_samples == 0) s.now.prefill_tokens_per_s = p0 * fleet_prefill_ratio_;
    ema(s.now.prefill_tokens_per_s, sample);
    ema(fleet_prefill_ratio_, sample / p0);
    ++s.now.prefill_samples;
  } else if (obs.cpu_tokens >= o_.min_uncached_tokens) {
    const double transfer_s = service - s.now.base_ttft_s -
                              static_cast<double>(obs.uncached_tokens) / std::max(s.now.prefill_tokens_per_s, 1.0);
    const double x0 = s.prior.transfer_tokens_per_s;
    double sample = transfer_s > 0 ? static_cast<double>(obs.cpu_tokens) / transfer_s : x0 * o_.clamp;
    ema(s.now.transfer_tokens_per_s, std::clamp(sample, x0 / o_.clamp, x0 * o_.clamp));
  }
  if (obs.output_tokens >= 2 && obs.itl_s > 0) {
    const double modelled = s.now.decode_step_s + s.now.decode_step_per_token_s * static_cast<double>(obs.decode_context_tokens);
    if (modelled > 0) {
      const double sample = std::clamp(obs.itl_s / modelled, 1.0 / o_.clamp, o_.clamp);
      if (s.now.decode_samples == 0) s.now.decode_correction = fleet_decode_correction_;
      ema(s.now.decode_correction, sample);
      ema(fleet_decode_correction_, sample);
      ++s.now.decode_samples;
    }
  }
  learn_errors(s, obs);
}

void RateLearner::learn_errors(State& s, const RateObservation& obs) {
  if (obs.estimated_ttft_s <= 0 || obs.ttft_s <= 0) return;
  const double a = o_.alpha;
  // ln of the ratio, clamped as the rate samples are, so one request stuck behind an unmodelled burst cannot
  // swing the correction.
  const double bound = std::log(o_.clamp);
  const double log_err = std::clamp(std::log(obs.ttft_s / obs.estimated_ttft_s), -bound, bound);
  if (s.now.error_samples == 0) s.now.ttft_log_error = fleet_ttft_log_error_;
  s.now.ttft_log_error += a * (log_err - s.now.ttft_log_error);
  fleet_ttft_log_error_ += a * (log_err - fleet_ttft_log_error_);
  s.now.ttft_abs_error += a * (std::abs(obs.ttft_s / obs.estimated_ttft_s - 1.0) - s.now.ttft_abs_error);
  if (obs.estimated_itl_s > 0 && obs.itl_s > 0)
    s.now.itl_abs_error += a * (std::abs(obs.itl_s / obs.estimated_itl_s - 1.0) - s.now.itl_abs_error);
  ++s.now.error_samples;
}

WorkerRates RateLearner::rates(WorkerId worker) const {
  std::lock_guard lock(mu_);
  if (worker >= workers_.size() || !workers_[worker].known) return WorkerRates{};
  return workers_[worker].now;
}

double RateLearner::typical_prefill_s(double tokens) const {
  double sum = 0;
  std::size_t n = 0;
  {
    std::lock_guard lock(mu_);
    for (const State& s : workers_) {
      if (!s.known) continue;
      sum += s.now.prefill_tokens_per_s;
      ++n;
    }
  }
  const double rate = n > 0 ? sum / static_cast<double>(n) : WorkerRates{}.prefill_tokens_per_s;
  return prefill_seconds(tokens, 0.0, rate);
}

void RateLearner::apply(WorkerView& view) const {
  WorkerRates r;
  {
    std::lock_guard lock(mu_);
    if (view.id < workers_.size() && workers_[view.id].known) {
      const State& s = workers_[view.id];
      r = s.now;
      if (r.prefill_samples == 0) r.prefill_tokens_per_s = s.prior.prefill_tokens_per_s * fleet_prefill_ratio_;
      if (r.decode_samples == 0) r.decode_correction = fleet_decode_correction_;
      if (r.error_samples == 0) r.ttft_log_error = fleet_ttft_log_error_;
    }
  }
  view.prefill_tokens_per_s = r.prefill_tokens_per_s;
  view.base_ttft_s = r.base_ttft_s;
  view.ttft_correction = std::exp(r.ttft_log_error);
  view.transfer_tokens_per_s = r.transfer_tokens_per_s;
  view.decode_step_s =
      r.decode_correction * (r.decode_step_s + r.decode_step_per_token_s * static_cast<double>(view.active_decode_tokens));
  view.decode_step_per_token_s = r.decode_correction * r.decode_step_per_token_s;
}

bool RateLearner::seed(WorkerId worker, const WorkerRates& learned) {
  std::lock_guard lock(mu_);
  State& s = state(worker);
  if (!s.known || s.now.prefill_samples > 0 || s.now.decode_samples > 0) return false;
  const std::uint64_t prefill = learned.prefill_samples, decode = learned.decode_samples;
  s.now = learned;
  // What was learned elsewhere guides the first decisions; the counts stay this replica's own, so that the
  // next sample here starts the EMA from the seeded value and later seeds no longer apply.
  s.now.prefill_samples = s.now.decode_samples = 0;
  return prefill > 0 || decode > 0;
}

void RateLearner::forget(WorkerId worker) {
  std::lock_guard lock(mu_);
  if (worker < workers_.size()) workers_[worker] = State{};
}

}  // namespace kvroute::policy
