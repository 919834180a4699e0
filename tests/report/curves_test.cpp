// Tests for training curves (report/curves.h): reading metrics.jsonl into series, the axis ticks,
// the drawing's panels, and `dtorch plot` on run folders.
#include "dtorch/report/curves.h"

#include <gtest/gtest.h>

#include <fstream>
#include <utility>

#include "dtorch/core/error.h"
#include "dtorch/core/paths.h"
#include "support/command.h"
#include "support/workers.h"

namespace dtorch::report {
namespace {

using testing::contains;

// Two epochs of 4 steps with step records every 2 steps, phase times, and the first epoch
// written twice (a resumed run).
const char* kRun =
    R"({"kind":"step","step":2.0,"epoch":0.0,"train_loss":2.0,"lr":0.1,"samples_per_s":100.0}
{"kind":"epoch","epoch":0,"step":4,"train_loss":1.9,"test_loss":1.5,"test_accuracy":0.5,"samples_per_s":90,"seconds":1,"lr":0.1}
{"kind":"step","step":4.0,"epoch":0.0,"train_loss":1.8,"lr":0.1,"samples_per_s":110.0}
{"kind":"epoch","epoch":0,"step":4,"train_loss":1.7,"test_loss":1.4,"test_accuracy":0.55,"samples_per_s":95,"seconds":1,"lr":0.1}
{"kind":"step","step":6.0,"epoch":1.0,"train_loss":1.2,"lr":0.05,"samples_per_s":120.0}
{"kind":"epoch","epoch":1,"step":8,"train_loss":1.1,"test_loss":1.0,"test_accuracy":0.7,"samples_per_s":99,"seconds":1,"lr":0.05,"forward_ms":2.5,"backward_ms":5.0,"data_ms":0.5,"step_ms":1.0}
)";

TEST(Curves, RecordsBecomeSeriesAgainstTheOptimizerStep) {
  auto c = parse_run_curves(kRun, "metrics.jsonl", "a");
  EXPECT_TRUE(c.x_is_step);
  ASSERT_EQ(c.train_loss.size(), 3u) << "the step records, not the epochs";
  EXPECT_EQ(c.train_loss[2].x, 6);
  EXPECT_EQ(c.train_loss[2].y, 1.2);
  ASSERT_EQ(c.test_accuracy.size(), 2u) << "epoch 0 once: its last record";
  EXPECT_EQ(c.test_accuracy[0].x, 4);
  EXPECT_DOUBLE_EQ(c.test_accuracy[0].y, 55);
  EXPECT_EQ(c.epoch_ends, (std::vector<double>{4, 8}));
  EXPECT_EQ(c.lr.back().y, 0.05);
  EXPECT_EQ(c.phase_ms.at("backward"), 5.0);
  EXPECT_EQ(c.phase_ms.size(), 4u);
}

TEST(Curves, OldFilesWithoutStepsUseEpochs) {
  auto c = parse_run_curves(
      R"({"kind":"epoch","epoch":0,"train_loss":1,"test_loss":1,"test_accuracy":0.5,"samples_per_s":9,"seconds":1}
{"kind":"epoch","epoch":1,"train_loss":0.5,"test_loss":0.8,"test_accuracy":null,"samples_per_s":9,"seconds":1}
)",
      "old.jsonl", "old");
  EXPECT_FALSE(c.x_is_step);
  EXPECT_EQ(c.train_loss.size(), 2u);
  EXPECT_EQ(c.train_loss[1].x, 2) << "x counts epochs";
  EXPECT_EQ(c.test_accuracy.size(), 1u) << "null (a non-finite value) is left out";
}

TEST(Curves, BadFilesAreNamed) {
  try {
    parse_run_curves(std::string(kRun) + "{\"kind\":\"ep", "runs/x/metrics.jsonl", "x");
    ADD_FAILURE() << "no error";
  } catch (const DataError& e) {
    EXPECT_TRUE(contains(e.what(), "runs/x/metrics.jsonl:7: not a JSON object")) << e.what();
  }
  EXPECT_THROW(parse_run_curves("", "empty.jsonl", "e"), ConfigError);
  // Found by tests/fuzz/run_curves_fuzz: fields of the wrong type are named, not a JSON library's
  // type_error.
  EXPECT_THROW(parse_run_curves("{\"kind\": 5.2, \"epoch\": 0}\n", "k", "k"), ConfigError)
      << "a record of no known kind is skipped: nothing to plot";
  try {
    parse_run_curves("{\"kind\": \"epoch\", \"epoch\": \"one\"}\n", "runs/y/metrics.jsonl", "y");
    ADD_FAILURE() << "no error";
  } catch (const DataError& e) {
    EXPECT_TRUE(
        contains(e.what(), "runs/y/metrics.jsonl:1: an epoch record whose \"epoch\" is not"))
        << e.what();
  }
  try {
    read_run_curves("/nonexistent/run", "x");
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(contains(e.what(), "/nonexistent/run/metrics.jsonl: no such file; give the --out"))
        << e.what();
  }
}

TEST(Curves, TicksAreRoundNumbersCoveringTheRange) {
  const std::vector<double> want{0, 0.2, 0.4, 0.6, 0.8, 1};
  auto got = nice_ticks(0, 0.93);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 1e-12);
  auto t = nice_ticks(1230, 1510);
  EXPECT_LE(t.front(), 1230);
  EXPECT_GE(t.back(), 1510);
  EXPECT_EQ(t, (std::vector<double>{1200, 1300, 1400, 1500, 1600}));
  EXPECT_GE(nice_ticks(3, 3).size(), 2u) << "an empty range still gets an axis";
  // Ranges from a damaged metrics file: wider than a double holds, or steps lost to rounding.
  for (auto [lo, hi] :
       {std::pair{-1e308, 1e308}, std::pair{1e17, 1e17 + 16}, std::pair{1e300, 1e300}}) {
    const auto ends = nice_ticks(lo, hi);
    ASSERT_GE(ends.size(), 2u) << lo << " " << hi;
    EXPECT_LE(ends.front(), lo);
    EXPECT_GE(ends.back(), hi);
  }
}

TEST(Curves, PanelsAndLegendAreDrawn) {
  auto a = parse_run_curves(kRun, "a.jsonl", "run-a");
  auto b = a;
  b.label = "run-b";
  b.phase_ms.clear();
  const std::string svg = draw_curves({a, b}, "two runs").svg();
  for (const char* s : {"two runs", "loss (line: train, squares: test)", "test accuracy (%)",
                        "samples/s (all ranks)", "learning rate", "run-a", "run-b",
                        "ms per optimizer step, by phase", "backward"})
    EXPECT_TRUE(contains(svg, s)) << s;
  b.phase_ms.clear();
  EXPECT_FALSE(contains(draw_curves({b}, "one").svg(), "by phase")) << "no phases recorded";
}

TEST(Curves, PlotWritesAPictureOfSeveralRuns) {
  const std::string dir = testing::scratch_dir("plot_cli");
  for (const char* run : {"a", "b"}) {
    paths::create_directories(dir + "/" + run);
    std::ofstream(dir + "/" + run + "/metrics.jsonl") << kRun;
  }
  auto r = testing::run_command("plot",
                                {DTORCH_CLI, "plot", dir + "/a", dir + "/b", "--out",
                                 dir + "/curves.png", "--label", "first", "--label", "second"},
                                60);
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  std::ifstream png(dir + "/curves.png", std::ios::binary);
  std::string head(8, '\0');
  png.read(head.data(), 8);
  EXPECT_EQ(head, "\x89PNG\r\n\x1a\n");
  r = testing::run_command("plot_svg",
                           {DTORCH_CLI, "plot", dir + "/a", "--out", dir + "/curves.svg"}, 60);
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_TRUE(contains(testing::read_file(dir + "/curves.svg"), dir + "/a")) << "default label";
  r = testing::run_command(
      "plot_labels",
      {DTORCH_CLI, "plot", dir + "/a", dir + "/b", "--out", dir + "/x.png", "--label", "one"}, 60);
  EXPECT_NE(r.exit_code(), 0);
  EXPECT_TRUE(contains(r.err, "--label was given 1 time(s) for 2 run folder(s)")) << r.err;
  r = testing::run_command("plot_missing",
                           {DTORCH_CLI, "plot", dir + "/none", "--out", dir + "/x.png"}, 60);
  EXPECT_NE(r.exit_code(), 0);
  EXPECT_TRUE(contains(r.err, dir + "/none/metrics.jsonl")) << r.err;
  EXPECT_FALSE(paths::exists(dir + "/x.png"));
}

}  // namespace
}  // namespace dtorch::report
