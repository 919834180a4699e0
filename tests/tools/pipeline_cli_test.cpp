// `dtorch pipeline show`: the timeline a user sees, with the bubble and activations the
// simulator computes, and bad flags refused.
#include <gtest/gtest.h>

#include "support/command.h"

namespace dtorch {
namespace {

TEST(PipelineCli, ShowPrintsTheTimelineBubbleAndActivations) {
  auto r = testing::run_command("pipeline_show",
                                {DTORCH_CLI, "pipeline", "show", "--schedule", "gpipe", "--stages",
                                 "2", "--microbatches", "2"},
                                30);
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_TRUE(testing::contains(r.out, "rank 0 |F0 F1 .  .  .  B0 B0 B1 B1 |")) << r.out;
  EXPECT_TRUE(testing::contains(r.out, "rank 1 |.  F0 F1 B0 B0 B1 B1 .  .  |")) << r.out;
  EXPECT_TRUE(testing::contains(r.out, "bubble (idle fraction per rank): 0.333")) << r.out;
  EXPECT_TRUE(testing::contains(r.out, "peak activations (micro-batches) per rank: 2 2")) << r.out;
  auto f = testing::run_command(
      "pipeline_1f1b", {DTORCH_CLI, "pipeline", "show", "--stages", "4", "--microbatches", "8"},
      30);
  ASSERT_EQ(f.exit_code(), 0) << f.err;
  EXPECT_TRUE(testing::contains(f.out, "peak activations (micro-batches) per rank: 4 3 2 1"))
      << f.out;
  auto bad = testing::run_command("pipeline_bad",
                                  {DTORCH_CLI, "pipeline", "show", "--schedule", "zigzag"}, 30);
  EXPECT_NE(bad.exit_code(), 0);
  EXPECT_TRUE(testing::contains(bad.err, "zigzag")) << bad.err;
}

}  // namespace
}  // namespace dtorch
