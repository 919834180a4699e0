// `dtorch pipeline show`: the timeline a user sees, with the bubble and activations the
// simulator computes, and bad flags refused.
#include <gtest/gtest.h>

#include "support/command.h"
#include "support/workers.h"

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
  EXPECT_TRUE(testing::contains(r.out, "peak activations (stage micro-batches) per rank: 2 2"))
      << r.out;
  auto f = testing::run_command(
      "pipeline_1f1b", {DTORCH_CLI, "pipeline", "show", "--stages", "4", "--microbatches", "8"},
      30);
  ASSERT_EQ(f.exit_code(), 0) << f.err;
  EXPECT_TRUE(testing::contains(f.out, "peak activations (stage micro-batches) per rank: 4 3 2 1"))
      << f.out;
  auto z = testing::run_command(
      "pipeline_zb",
      {DTORCH_CLI, "pipeline", "show", "--schedule", "zb", "--stages", "4", "--microbatches", "8"},
      30);
  ASSERT_EQ(z.exit_code(), 0) << z.err;
  EXPECT_TRUE(testing::contains(z.out, "bubble (idle fraction per rank): 0.111")) << z.out;
  const std::string svg = testing::scratch_dir("pipeline-svg") + "/pipeline.svg";
  auto i = testing::run_command("pipeline_interleaved",
                                {DTORCH_CLI, "pipeline", "show", "--schedule", "interleaved",
                                 "--stages", "4", "--microbatches", "8", "--out", svg},
                                30);
  ASSERT_EQ(i.exit_code(), 0) << i.err;
  EXPECT_TRUE(testing::contains(i.out, "4 ranks x 2 stages")) << i.out;
  EXPECT_TRUE(testing::contains(i.out, "0.158, (p-1)/(v m+p-1) = 0.158")) << i.out;
  EXPECT_TRUE(testing::contains(testing::read_file(svg), "</svg>"));
  const std::string png = testing::scratch_dir("pipeline-png") + "/zb.png";
  auto p = testing::run_command(
      "pipeline_png", {DTORCH_CLI, "pipeline", "show", "--schedule", "zb", "--out", png}, 30);
  ASSERT_EQ(p.exit_code(), 0) << p.err;
  EXPECT_TRUE(testing::contains(p.out, "wrote " + png)) << p.out;
  EXPECT_EQ(testing::read_file(png).substr(0, 8), std::string("\x89PNG\r\n\x1a\n"));
  auto jpg = testing::run_command("pipeline_jpg",
                                  {DTORCH_CLI, "pipeline", "show", "--out", png + ".jpg"}, 30);
  EXPECT_NE(jpg.exit_code(), 0);
  EXPECT_TRUE(testing::contains(jpg.err, "written as .png or .svg")) << jpg.err;
  auto bad = testing::run_command("pipeline_bad",
                                  {DTORCH_CLI, "pipeline", "show", "--schedule", "zigzag"}, 30);
  EXPECT_NE(bad.exit_code(), 0);
  EXPECT_TRUE(testing::contains(bad.err, "zigzag")) << bad.err;
}

}  // namespace
}  // namespace dtorch
