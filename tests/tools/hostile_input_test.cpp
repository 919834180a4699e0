// Hostile and mistaken input on the command line, as a user gives it: each gets one line naming
// the problem, the value as given and the fix, within seconds, and never a crash, a hang, a
// backtrace, a library's text or a source location (Note [Input files] in core/input_file.h).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <fstream>

#include "support/command.h"
#include "support/workers.h"

namespace dtorch {
namespace {

using testing::contains;
using testing::run_command;

// Runs `dtorch ARGS` and checks that it failed with one clear line holding `want`.
void expect_refused(const std::string& name, std::vector<std::string> args,
                    const std::string& want) {
  args.insert(args.begin(), DTORCH_CLI);
  const auto r = run_command("hostile-" + name, args, 60);
  EXPECT_GT(r.exit_code(), 0) << name << ": " << r.err;
  EXPECT_LT(r.exit_code(), 128) << name << " ended by a signal: " << r.err;
  EXPECT_TRUE(contains(r.err, want)) << name << ": " << r.err;
  for (const char* noise : {"unexpected error", "[src/", "json.exception", "frame #", "terminate"})
    EXPECT_FALSE(contains(r.err, noise)) << name << ": " << r.err;
  // One line; the flag parser adds "Run with --help for more information."
  EXPECT_LE(std::count(r.err.begin(), r.err.end(), '\n'), 2) << name << ": " << r.err;
}

TEST(HostileInput, FilesThatAreNotFilesAndJsonThatIsNotSane) {
  const std::string dir = testing::scratch_dir("hostile-files");
  ASSERT_EQ(::mkfifo((dir + "/fifo").c_str(), 0600), 0);
  {
    std::ofstream deep(dir + "/deep.json");
    for (int i = 0; i < 100000; ++i)
      deep << '[';
  }
  std::ofstream(dir + "/huge.json") << R"({"training": {"epochs": 1e400}})";
  const std::string give = "give the config.json of a run";
  expect_refused("config-dir", {"train", "--config", dir}, "--config " + dir + ": is a directory");
  expect_refused("config-fifo", {"train", "--config", dir + "/fifo"},
                 "is a FIFO (named pipe), not a file to read; " + give);
  expect_refused("config-zero", {"train", "--config", "/dev/zero"},
                 "--config /dev/zero: is a character device");
  expect_refused("config-deep", {"train", "--config", dir + "/deep.json"},
                 "nests objects and arrays more than 64 deep");
  expect_refused("config-huge", {"train", "--config", dir + "/huge.json"},
                 "number overflow parsing '1e400'");
  expect_refused("ds-fifo", {"train", "--deepspeed-config", dir + "/fifo"},
                 "--deepspeed-config " + dir + "/fifo: is a FIFO");
  expect_refused("ds-zero", {"train", "--deepspeed-config", "/dev/zero"}, "is a character device");
  expect_refused(
      "text-fifo",
      {"train", "--model", "gpt-debug", "--data", "text:" + dir + "/fifo", "--out", dir + "/run"},
      "is a FIFO (named pipe)");
  expect_refused("plot-dir", {"plot", dir, "--out", dir + "/curves.png"}, "metrics.jsonl");
}

TEST(HostileInput, NumbersAreCheckedBeforeTheyAreUsed) {
  expect_refused("flag-lr-inf", {"train", "--lr", "inf", "--print-config"},
                 "not a finite number (got inf)");
  expect_refused("flag-betas-nan", {"train", "--betas", "0.9,nan", "--print-config"},
                 "not a finite number (got nan)");
  expect_refused("flag-bucket", {"train", "--bucket-cap-mb", "1e30", "--print-config"},
                 "--bucket-cap-mb must lie above 0 and at most 1048576 (1 TiB) (got 1e+30)");
}

// A loss that turns NaN stops the run at that step, naming the rank and the step, before a
// model of NaNs is written.
TEST(HostileInput, ADivergingLossStopsTheRunNamingRankAndStep) {
  const std::string dir = testing::scratch_dir("hostile-nan");
  const auto r = run_command(
      "hostile-nan",
      {DTORCH_CLI, "train", "--model", "mnist-mlp", "--lr", "1e30", "--epochs", "1",
       "--train-samples", "640", "--test-samples", "64", "--out", dir, "--progress", "off"},
      120);
  EXPECT_EQ(r.exit_code(), 1) << r.err;
  EXPECT_TRUE(contains(r.err, "on rank 0 at step ")) << r.err;
  EXPECT_TRUE(contains(r.err, "Lower --lr")) << r.err;
  EXPECT_FALSE(contains(r.err, "[src/")) << r.err;
  EXPECT_FALSE(testing::contains(r.out + r.err, "wrote")) << "no model is written";
}

}  // namespace
}  // namespace dtorch
