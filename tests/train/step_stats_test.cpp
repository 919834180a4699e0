// What the training loop and the benchmarks measure of their steps: the median step time.
#include "dtorch/train/step_stats.h"

#include <gtest/gtest.h>

namespace dtorch::train {
namespace {

TEST(StepStats, MedianIsTheMiddleStepOrTheMeanOfTheTwoMiddleOnes) {
  EXPECT_EQ(median_seconds({}), 0);
  EXPECT_EQ(median_seconds({2.5}), 2.5);
  // One slow step (a page-fault storm) does not move it; the mean would be 4.
  EXPECT_EQ(median_seconds({1.0, 10.0, 1.0}), 1.0);
  EXPECT_EQ(median_seconds({3.0, 1.0, 2.0}), 2.0);
  EXPECT_EQ(median_seconds({4.0, 1.0, 3.0, 2.0}), 2.5);
  EXPECT_EQ(median_seconds({5.0, 1.0}), 3.0);
}

}  // namespace
}  // namespace dtorch::train
