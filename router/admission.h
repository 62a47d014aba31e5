// Admission: a cap on the API requests served at once (--max-concurrent-requests) and a bounded queue of those
// beyond it (--max-queued-requests), shared by every I/O thread. Past the queue's bound the handler answers 429
// with Retry-After (as it does when a request waited --queue-timeout in the queue).
//
// Fairness across tenants: each tenant has its own FIFO queue, and a slot that frees goes to the waiting
// tenant with the fewest requests in flight, and among those to the one served least recently: round-robin
// over the tenants' queues, weighted towards max-min fairness of the slots. A tenant's burst therefore never
// starves another: a tenant with one request waiting is served before the next of a tenant that already holds
// slots, or that was served last. Requests without a tenant share the tenant "" like any other.
//
// Thread-safe: one mutex guards the counts and queues; nothing runs under it (a granted waiter's wake-up runs
// after it is released, on the releasing thread: it posts to its own).
//
//   std::uint64_t id = 0;
//   switch (adm.admit(tenant, &id, [..](std::uint64_t id) { post(ex, on_admitted(id)); })) {
//     case Admission::kAdmitted: serve(); break;            // later: adm.release(tenant)
//     case Admission::kQueued: wait(id); break;             // its wake-up grants the slot, or adm.cancel(id)
//     case Admission::kRejected: answer_429(); break;
//   }
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

namespace kvroute::router {

class Admission {
 public:
  enum Verdict { kAdmitted, kQueued, kRejected };
  using Wake = std::function<void(std::uint64_t id)>;  // the id admit() gave

  Admission(std::size_t max_concurrent, std::size_t max_queued)
      : max_concurrent_(max_concurrent), max_queued_(max_queued) {}

  // kAdmitted: a slot is the caller's (release() it). kQueued: `wake` runs once a slot is granted (the slot is
  // then the caller's), unless cancel(*id) took it out of the queue first. kRejected: the queue is full.
  Verdict admit(std::string_view tenant, std::uint64_t* id, Wake wake);
  // Takes a queued request out (its client left, or its wait timed out): true when it was still queued; false
  // when it was granted meanwhile: its wake-up is on its way, and the slot must be released.
  bool cancel(std::uint64_t id);
  // The tenant's request ended: its slot goes to the next waiting request, if any.
  void release(std::string_view tenant);

  std::size_t in_flight() const;
  std::size_t queued() const;

 private:
  struct Waiter {
    std::uint64_t id;
    Wake wake;
  };
  struct Tenant {
    std::size_t in_flight = 0;
    std::uint64_t served_at = 0;  // the admission count when it was last given a slot
    std::deque<Waiter> waiting;
  };
  // The tenant served next: fewest in flight, then least recently served. Under mu_.
  std::deque<std::string>::iterator next_tenant();
  void forget_if_idle(const std::string& tenant);

  const std::size_t max_concurrent_;
  const std::size_t max_queued_;
  mutable std::mutex mu_;
  std::size_t in_flight_ = 0;  // guarded by mu_, as everything below
  std::size_t queued_ = 0;
  std::uint64_t next_id_ = 1;
  std::uint64_t admissions_ = 0;
  std::unordered_map<std::string, Tenant> tenants_;     // tenants with requests in flight or waiting
  std::deque<std::string> rotation_;                    // tenants with waiting requests
  std::unordered_map<std::uint64_t, std::string> where_;  // a waiting request's tenant
};

}  // namespace kvroute::router
