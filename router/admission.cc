#include "router/admission.h"

#include <algorithm>
#include <utility>

namespace kvroute::router {

Admission::Verdict Admission::admit(std::string_view tenant, std::uint64_t* id, Wake wake) {
  std::lock_guard lock(mu_);
  // Nothing waits ahead of it: served at once while under the cap.
  if (queued_ == 0 && in_flight_ < max_concurrent_) {
    ++in_flight_;
    Tenant& t = tenants_[std::string(tenant)];
    ++t.in_flight;
    t.served_at = ++admissions_;
    return kAdmitted;
  }
  if (queued_ >= max_queued_) return kRejected;
  const std::string name(tenant);
  Tenant& t = tenants_[name];
  if (t.waiting.empty()) rotation_.push_back(name);
  *id = next_id_++;
  t.waiting.push_back(Waiter{*id, std::move(wake)});
  where_.emplace(*id, name);
  ++queued_;
  return kQueued;
}

bool Admission::cancel(std::uint64_t id) {
  std::lock_guard lock(mu_);
  auto at = where_.find(id);
  if (at == where_.end()) return false;
  const std::string tenant = std::move(at->second);
  where_.erase(at);
  Tenant& t = tenants_[tenant];
  t.waiting.erase(std::find_if(t.waiting.begin(), t.waiting.end(), [id](const Waiter& w) { return w.id == id; }));
  --queued_;
  if (t.waiting.empty()) rotation_.erase(std::find(rotation_.begin(), rotation_.end(), tenant));
  forget_if_idle(tenant);
  return true;
}

std::deque<std::string>::iterator Admission::next_tenant() {
  auto best = rotation_.begin();
  const Tenant* b = &tenants_[*best];
  for (auto it = std::next(best); it != rotation_.end(); ++it) {
    const Tenant& t = tenants_[*it];
    if (t.in_flight < b->in_flight || (t.in_flight == b->in_flight && t.served_at < b->served_at)) {
      best = it;
      b = &t;
    }
  }
  return best;
}

void Admission::release(std::string_view tenant) {
  Wake wake;
  std::uint64_t granted = 0;
  {
    std::lock_guard lock(mu_);
    const std::string name(tenant);
    if (auto it = tenants_.find(name); it != tenants_.end() && it->second.in_flight > 0) {
      --it->second.in_flight;
      forget_if_idle(name);
    }
    if (rotation_.empty()) {
      --in_flight_;
      return;
    }
    // The slot passes to the next waiting request (in_flight_ stays).
    auto next = next_tenant();
    const std::string chosen = std::move(*next);
    rotation_.erase(next);
    Tenant& t = tenants_[chosen];
    Waiter w = std::move(t.waiting.front());
    t.waiting.pop_front();
    where_.erase(w.id);
    --queued_;
    ++t.in_flight;
    t.served_at = ++admissions_;
    if (!t.waiting.empty()) rotation_.push_back(chosen);
    wake = std::move(w.wake);
    granted = w.id;
  }
  wake(granted);
}

void Admission::forget_if_idle(const std::string& tenant) {
  auto it = tenants_.find(tenant);
  if (it != tenants_.end() && it->second.in_flight == 0 && it->second.waiting.empty()) tenants_.erase(it);
}

std::size_t Admission::in_flight() const {
  std::lock_guard lock(mu_);
  return in_flight_;
}

std::size_t Admission::queued() const {
  std::lock_guard lock(mu_);
  return queued_;
}

}  // namespace kvroute::router
