#include "router/admission.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace kvroute::router {
namespace {

// Queues a request of `tenant`; its wake-up appends the tenant to `served`.
Admission::Verdict queue(Admission& a, const std::string& tenant, std::vector<std::string>& served,
                         std::uint64_t* id = nullptr) {
  std::uint64_t ignored = 0;
  return a.admit(tenant, id ? id : &ignored, [&served, tenant](std::uint64_t) { served.push_back(tenant); });
}

TEST(Admission, AdmitsUpToTheCapThenQueuesThenRejects) {
  Admission a(2, 1);
  std::vector<std::string> served;
  EXPECT_EQ(queue(a, "a", served), Admission::kAdmitted);
  EXPECT_EQ(queue(a, "a", served), Admission::kAdmitted);
  EXPECT_EQ(queue(a, "a", served), Admission::kQueued);
  EXPECT_EQ(queue(a, "b", served), Admission::kRejected);
  EXPECT_EQ(a.in_flight(), 2u);
  EXPECT_EQ(a.queued(), 1u);
  a.release("a");  // the slot passes to the queued one
  EXPECT_EQ(served, std::vector<std::string>{"a"});
  EXPECT_EQ(a.in_flight(), 2u);
  EXPECT_EQ(a.queued(), 0u);
  a.release("a");
  a.release("a");
  EXPECT_EQ(a.in_flight(), 0u);
}

TEST(Admission, ATenantWithFewerSlotsOrServedLessRecentlyGoesFirst) {
  Admission a(1, 16);
  std::vector<std::string> served;
  ASSERT_EQ(queue(a, "a", served), Admission::kAdmitted);
  for (int i = 0; i < 3; ++i) queue(a, "a", served);
  queue(a, "b", served);
  queue(a, "c", served);
  queue(a, "b", served);
  for (int i = 0; i < 7; ++i) a.release(served.empty() ? "a" : served.back());
  // a held the slot and was served last: b and c first, then round-robin.
  EXPECT_EQ(served, (std::vector<std::string>{"b", "c", "a", "b", "a", "a"}));
  EXPECT_EQ(a.in_flight(), 0u);
}

TEST(Admission, ACancelledWaiterIsSkippedAndACancelAfterTheGrantSaysSo) {
  Admission a(1, 4);
  std::vector<std::string> served;
  ASSERT_EQ(queue(a, "a", served), Admission::kAdmitted);
  std::uint64_t b = 0, c = 0;
  queue(a, "b", served, &b);
  queue(a, "c", served, &c);
  EXPECT_TRUE(a.cancel(b));
  EXPECT_FALSE(a.cancel(b));
  a.release("a");
  EXPECT_EQ(served, std::vector<std::string>{"c"});
  EXPECT_FALSE(a.cancel(c)) << "granted already";
  a.release("c");
  EXPECT_EQ(a.in_flight(), 0u);
  EXPECT_EQ(a.queued(), 0u);
}

}  // namespace
}  // namespace kvroute::router
