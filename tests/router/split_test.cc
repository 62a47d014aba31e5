#include "util/split.h"

#include <gtest/gtest.h>

namespace kvroute {
namespace {

using Items = std::vector<std::string_view>;

TEST(Split, KeepsEveryItemEmptyOnesIncluded) {
  EXPECT_EQ(split("a,bc,d", ','), (Items{"a", "bc", "d"}));
  EXPECT_EQ(split("a,,b,", ','), (Items{"a", "", "b", ""}));
  EXPECT_EQ(split("", ','), (Items{""}));
  EXPECT_EQ(split("no separator", ','), (Items{"no separator"}));
  EXPECT_EQ(split("k=v;x", ';'), (Items{"k=v", "x"}));
}

}  // namespace
}  // namespace kvroute
