// The failover logic alone: the retry budget (router/retry_budget.h) and passive outlier detection
// (backends/outlier_detector.h), with a registry of workers and a clock the test moves.
#include <chrono>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "backends/outlier_detector.h"
#include "router/retry_budget.h"

namespace kvroute {
namespace {

using namespace std::chrono_literals;
using backends::OutlierDetector;
using router::RetryBudget;

TEST(RetryBudget, AllowsTheMinimumConcurrencyWhenQuiet) {
  RetryBudget budget({2, 20, 3});
  EXPECT_EQ(budget.limit(0), 3u);
  EXPECT_EQ(budget.limit(10), 3u);  // 20 % of 10 is 2, below the minimum
  std::vector<RetryBudget::Ticket> held;
  for (int i = 0; i < 3; ++i) {
    auto t = budget.try_acquire(1);
    ASSERT_TRUE(t) << i;
    held.push_back(std::move(*t));
  }
  EXPECT_FALSE(budget.try_acquire(1));
  EXPECT_EQ(budget.active(), 3u);
}

TEST(RetryBudget, IsAShareOfTheActiveRequestsAndTicketsGiveTheirPlaceBack) {
  RetryBudget budget({2, 20, 3});
  EXPECT_EQ(budget.limit(100), 20u);
  std::vector<RetryBudget::Ticket> held;
  for (int i = 0; i < 20; ++i) held.push_back(std::move(*budget.try_acquire(100)));
  EXPECT_FALSE(budget.try_acquire(100));
  EXPECT_TRUE(budget.try_acquire(105)) << "21 of 105 requests is 20 %";  // (a temporary: given back at once)
  held.pop_back();
  EXPECT_EQ(budget.active(), 19u);
  auto again = budget.try_acquire(100);
  ASSERT_TRUE(again);
  RetryBudget::Ticket moved = std::move(*again);
  again.reset();
  EXPECT_EQ(budget.active(), 20u) << "a moved-from ticket holds nothing";
  moved.reset();
  moved.reset();
  EXPECT_EQ(budget.active(), 19u);
  held.clear();
  EXPECT_EQ(budget.active(), 0u);
}

class Outliers : public ::testing::Test {
 protected:
  std::shared_ptr<backends::Worker> add(int port) {
    auto ep = backends::parse_worker_url("http://127.0.0.1:" + std::to_string(port));
    const auto id = registry_.add(*ep);
    return registry_.find(*id);
  }
  // `n` failures in a row at `now`; true if one of them ejected the worker.
  bool fail(OutlierDetector& d, backends::Worker& w, int n, OutlierDetector::Clock::time_point now) {
    bool ejected = false;
    for (int i = 0; i < n; ++i) ejected = d.failure(w, now) || ejected;
    return ejected;
  }
  backends::WorkerRegistry registry_;
  const OutlierDetector::Clock::time_point t0_ = OutlierDetector::Clock::now();
};

TEST_F(Outliers, FiveConsecutiveFailuresEjectForThirtySecondsAndSuccessResetsTheRun) {
  auto a = add(1), b = add(2);
  int ejections = 0;
  OutlierDetector d(registry_, {}, [&](const backends::Worker&, auto) { ++ejections; });
  EXPECT_FALSE(fail(d, *a, 4, t0_));
  d.success(*a);
  EXPECT_EQ(a->consecutive_failures(), 0u);
  EXPECT_FALSE(fail(d, *a, 4, t0_));
  EXPECT_TRUE(d.failure(*a, t0_));
  EXPECT_EQ(ejections, 1);
  EXPECT_EQ(a->ejections(), 1u);
  EXPECT_TRUE(a->ejected(t0_ + 29s));
  EXPECT_FALSE(a->ejected(t0_ + 30s));
  EXPECT_EQ(a->ejected_until(), t0_ + 30s);
  EXPECT_FALSE(a->view(t0_ + 1s).healthy) << "an ejected worker is no candidate for routing";
  EXPECT_TRUE(b->view(t0_ + 1s).healthy);
  EXPECT_EQ(d.ejected_count(t0_ + 1s), 1u);
  EXPECT_EQ(d.ejected_count(t0_ + 31s), 0u);
}

TEST_F(Outliers, EjectionsInARowLastLongerUpToTheCapAndDecayBackInRotation) {
  auto a = add(1), b = add(2);
  OutlierDetector d(registry_, {});
  auto t = t0_;
  const std::vector<std::chrono::seconds> lasts = {30s, 60s, 90s};
  for (auto want : lasts) {
    ASSERT_TRUE(fail(d, *a, 5, t));
    EXPECT_EQ(a->ejected_until() - t, want);
    t = a->ejected_until() + 1s;  // fails again as soon as it is back
  }
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(fail(d, *a, 5, t));
    t = a->ejected_until() + 1s;
  }
  ASSERT_TRUE(fail(d, *a, 5, t));
  EXPECT_EQ(a->ejected_until() - t, 300s) << "Envoy's max_ejection_time";
  // Back in rotation for 10 minutes: 60 intervals of 10 s decay the multiplier to nothing.
  t = a->ejected_until() + 600s;
  ASSERT_TRUE(fail(d, *a, 5, t));
  EXPECT_EQ(a->ejected_until() - t, 30s);
}

TEST_F(Outliers, NeverEjectsTheLastRoutableWorker) {
  auto a = add(1), b = add(2);
  OutlierDetector d(registry_, {});
  ASSERT_TRUE(fail(d, *a, 5, t0_));
  EXPECT_FALSE(fail(d, *b, 20, t0_)) << "b is the only worker left to route to";
  EXPECT_FALSE(b->ejected(t0_));
  // Once a is back, b's next failure ejects it (its run went on counting).
  EXPECT_TRUE(d.failure(*b, t0_ + 31s));
  // A worker alone is never ejected.
  backends::WorkerRegistry alone;
  auto ep = backends::parse_worker_url("http://127.0.0.1:9");
  auto only = alone.find(*alone.add(*ep));
  OutlierDetector d1(alone, {});
  EXPECT_FALSE(fail(d1, *only, 50, t0_));
  // Workers out of rotation otherwise (unhealthy) do not count as somewhere to go.
  auto c = add(3);
  b->set_healthy(false);
  a->set_healthy(false);
  EXPECT_FALSE(fail(d, *c, 5, t0_ + 31s)) << "a and b fail their health checks: c is the last worker to go to";
}

TEST_F(Outliers, MaxEjectionPercentCapsEjectionsButOneAlwaysMay) {
  std::vector<std::shared_ptr<backends::Worker>> w;
  for (int i = 0; i < 10; ++i) w.push_back(add(i + 1));
  OutlierDetector::Options o;
  o.max_ejection_percent = 10;  // Envoy's default: one of ten
  OutlierDetector d(registry_, o);
  EXPECT_TRUE(fail(d, *w[0], 5, t0_));
  EXPECT_FALSE(fail(d, *w[1], 5, t0_));
  o.max_ejection_percent = 30;
  OutlierDetector d30(registry_, o);
  EXPECT_TRUE(fail(d30, *w[1], 1, t0_)) << "its run of 6 goes on";
  EXPECT_TRUE(fail(d30, *w[2], 5, t0_));
  EXPECT_FALSE(fail(d30, *w[3], 5, t0_)) << "3 of 10 ejected already";
  o.max_ejection_percent = 0;
  OutlierDetector d0(registry_, o);
  EXPECT_FALSE(fail(d0, *w[4], 5, t0_)) << "three are ejected; at 0 % one always may, not four";
  // An ejected worker that also fails its health checks (crashed) is out anyway: it takes no place in the cap.
  w[1]->set_healthy(false);
  w[2]->set_healthy(false);
  EXPECT_TRUE(fail(d30, *w[4], 1, t0_)) << "w[1] and w[2] are down as well: only w[0] counts against the cap";
  EXPECT_TRUE(fail(d30, *w[5], 5, t0_));
  EXPECT_FALSE(fail(d30, *w[6], 5, t0_)) << "w[0], w[4] and w[5]: three of ten";
}

TEST_F(Outliers, ZeroFailuresDisablesEjection) {
  auto a = add(1), b = add(2);
  OutlierDetector::Options o;
  o.consecutive_failures = 0;
  OutlierDetector d(registry_, o);
  EXPECT_FALSE(fail(d, *a, 100, t0_));
  EXPECT_EQ(a->ejections(), 0u);
}

}  // namespace
}  // namespace kvroute
