// LazyDeadline: a deadline that moves without timer operations, for timeouts set on every request of a
// connection (--client-idle-timeout, --request-timeout) where a timer operation per request would cost more
// than the request's own system calls.
//
// set() records the time point and arms the timer only when it is not armed yet; a timer that fires before the
// recorded point (the deadline moved on since) is armed again (the point only moves later: every set() is now
// plus the same timeout). `due` runs once the recorded point has passed; the owner decides there whether it
// still applies. The owner is held weakly, so a pending deadline never keeps it alive; `due` runs only while
// the owner lives. Not thread-safe: used on its owner's thread only.
//
//   LazyDeadline idle{ex, [this] { on_idle(); }};
//   idle.set(std::chrono::steady_clock::now() + timeout, weak_from_this());
#pragma once

#include <chrono>
#include <functional>
#include <memory>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/steady_timer.hpp>

namespace kvroute::router {

class LazyDeadline {
 public:
  LazyDeadline(const boost::asio::any_io_executor& ex, std::function<void()> due) : timer_(ex), due_(std::move(due)) {}

  void set(std::chrono::steady_clock::time_point at, std::weak_ptr<void> owner) {
    at_ = at;
    if (!armed_) arm(std::move(owner));
  }
  void cancel() { timer_.cancel(); }

 private:
  void arm(std::weak_ptr<void> owner) {
    armed_ = true;
    timer_.expires_at(at_);
    timer_.async_wait([this, owner = std::move(owner)](boost::system::error_code ec) mutable {
      auto alive = owner.lock();
      if (!alive) return;  // the owner, and this member of it, are gone
      armed_ = false;
      if (ec) return;
      if (std::chrono::steady_clock::now() < at_) return arm(std::move(owner));
      due_();
    });
  }

  boost::asio::steady_timer timer_;
  std::function<void()> due_;
  std::chrono::steady_clock::time_point at_;
  bool armed_ = false;
};

}  // namespace kvroute::router
