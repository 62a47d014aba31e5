// util::RecencyMap, which holds the router's session bindings and Responses API owners.
#include "util/recency_map.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace kvroute::util {
namespace {

TEST(RecencyMap, ForgetsTheLeastRecentlyPutBeyondCapacity) {
  RecencyMap<int> m(2);
  EXPECT_EQ(m.put("a", 1), 0u);
  EXPECT_EQ(m.put("b", 2), 0u);
  EXPECT_EQ(m.put("a", 3), 0u);  // a replaced and now the most recent
  EXPECT_EQ(m.put("c", 4), 1u);  // b goes
  EXPECT_EQ(m.size(), 2u);
  EXPECT_EQ(m.find("b"), nullptr);
  ASSERT_NE(m.find("a"), nullptr);
  EXPECT_EQ(*m.find("a"), 3);
  EXPECT_EQ(*m.find("c"), 4);
}

TEST(RecencyMap, HandsTheEvictedValueToItsCaller) {
  RecencyMap<int> m(2);
  std::vector<int> dropped;
  auto keep = [&](int&& v) { dropped.push_back(v); };
  EXPECT_EQ(m.put("a", 1, keep), 0u);
  EXPECT_EQ(m.put("b", 2, keep), 0u);
  EXPECT_EQ(m.put("b", 5, keep), 0u);  // replaced: nothing evicted
  EXPECT_EQ(m.put("c", 3, keep), 1u);
  EXPECT_EQ(dropped, (std::vector<int>{1}));
}

TEST(RecencyMap, FindDoesNotRefresh) {
  RecencyMap<int> m(2);
  m.put("a", 1);
  m.put("b", 2);
  EXPECT_NE(m.find("a"), nullptr);
  m.put("c", 3);  // a is still the oldest
  EXPECT_EQ(m.find("a"), nullptr);
  EXPECT_NE(m.find("b"), nullptr);
}

TEST(RecencyMap, DropsOldestWhileAndErasesByValue) {
  RecencyMap<int> m(10);
  for (int i = 0; i < 6; ++i) m.put("k" + std::to_string(i), i);
  m.put("k0", 10);  // refreshed: newest
  // Oldest first: k1 k2 k3 k4 k5 k0. Stops at the first value that fails.
  EXPECT_EQ(m.drop_oldest_while([](int v) { return v < 3; }), 2u);
  EXPECT_EQ(m.find("k1"), nullptr);
  EXPECT_EQ(m.find("k2"), nullptr);
  EXPECT_NE(m.find("k0"), nullptr);
  EXPECT_EQ(m.erase_if([](int v) { return v % 2 == 0; }), 2u);  // k4, k0
  EXPECT_EQ(m.size(), 2u);
  EXPECT_NE(m.find("k3"), nullptr);
  EXPECT_NE(m.find("k5"), nullptr);
  m.put("k6", 6);  // the map still works after erasing from the middle
  EXPECT_EQ(m.size(), 3u);
}

TEST(RecencyMap, TakeAndDropHandValuesBack) {
  RecencyMap<std::string> m(10);
  for (int i = 0; i < 5; ++i) m.put("k" + std::to_string(i), "v" + std::to_string(i));
  EXPECT_EQ(m.take("k2"), "v2");
  EXPECT_EQ(m.take("k2"), std::nullopt);
  EXPECT_EQ(m.find("k2"), nullptr);
  EXPECT_EQ(m.size(), 4u);
  std::vector<std::string> dropped;
  EXPECT_EQ(m.drop_oldest_while([](const std::string& v) { return v != "v3"; },
                                [&](std::string&& v) { dropped.push_back(std::move(v)); }),
            2u);
  EXPECT_EQ(dropped, (std::vector<std::string>{"v0", "v1"}));
  EXPECT_EQ(m.size(), 2u);
  m.put("k5", "v5");  // the map still works after taking from the middle
  ASSERT_NE(m.find("k3"), nullptr);
  EXPECT_EQ(*m.find("k5"), "v5");
}

TEST(RecencyMap, ManyKeysStayConsistent) {
  // Long keys (heap strings) and churn: every key in the map is found, and nothing beyond capacity is kept.
  RecencyMap<std::size_t> m(1000);
  std::size_t evicted = 0;
  for (std::size_t i = 0; i < 20000; ++i) {
    evicted += m.put("a-session-key-longer-than-sso-" + std::to_string(i % 3000), i);
  }
  EXPECT_EQ(m.size(), 1000u);
  // Cycling through 3000 keys, each key was put 3000 puts ago and is gone: every put after the first 1000
  // inserts and evicts one.
  EXPECT_EQ(evicted, 19000u);
  // The 1000 kept are the last 1000 put (i = 19000..19999: keys 1000..1999).
  for (std::size_t k = 0; k < 3000; ++k) {
    const std::size_t* v = m.find("a-session-key-longer-than-sso-" + std::to_string(k));
    if (k >= 1000 && k < 2000) {
      ASSERT_NE(v, nullptr) << k;
      EXPECT_EQ(*v, 18000 + k);
    } else {
      EXPECT_EQ(v, nullptr) << k;
    }
  }
}

}  // namespace
}  // namespace kvroute::util
