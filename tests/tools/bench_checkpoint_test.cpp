// `dtorch bench checkpoint`: one JSON line per rank with every step's time and the save's stall
// and duration; a background save writes the checkpoint a blocking one does (the same bytes);
// a --dir that holds anything is refused, since the benchmark writes there.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "dtorch/core/paths.h"
#include "support/command.h"
#include "support/workers.h"

namespace dtorch {
namespace {

std::vector<nlohmann::json> run_bench(const std::string& strategy, bool async_save,
                                      const std::string& dir = "") {
  std::vector<std::string> args = {DTORCH_CLI,  "bench",      "checkpoint", "--model",
                                   "gpt-debug", "--strategy", strategy,     "--nproc-per-node",
                                   "2",         "--steps",    "3",          "--save-at",
                                   "1",         "--seq-len",  "16"};
  if (async_save) args.push_back("--async-checkpoint");
  if (!dir.empty()) args.insert(args.end(), {"--dir", dir});
  auto r = testing::run_command("bench_checkpoint_" + strategy, args, 180);
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  std::vector<nlohmann::json> rows;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);)
    if (nlohmann::json::accept(line)) rows.push_back(nlohmann::json::parse(line));
  EXPECT_EQ(rows.size(), 2u) << r.out;
  return rows;
}

TEST(BenchCheckpoint, BackgroundSaveWritesWhatABlockingOneWritesAndIsTimed) {
  for (const std::string strategy : {"ddp", "zero3"}) {
    const auto blocking = run_bench(strategy, false);
    const auto background = run_bench(strategy, true);
    ASSERT_EQ(blocking.size(), 2u);
    ASSERT_EQ(background.size(), 2u);
    for (const auto& rows : {blocking, background}) {
      for (const auto& r : rows) {
        EXPECT_EQ(r["step_seconds"].size(), 3u) << r;
        EXPECT_GT(r["stall_seconds"].get<double>(), 0) << r;
        EXPECT_GE(r["save_total_seconds"].get<double>(), r["stall_seconds"].get<double>()) << r;
        EXPECT_GT(r["checkpoint_bytes"].get<int64_t>(), 0) << r;
      }
    }
    EXPECT_EQ(blocking[0]["mode"], "blocking");
    EXPECT_EQ(background[0]["mode"], "async");
    EXPECT_EQ(blocking[0]["checkpoint_bytes"], background[0]["checkpoint_bytes"]) << strategy;
  }
}

TEST(BenchCheckpoint, AFolderThatHoldsFilesIsRefused) {
  const std::string dir = testing::scratch_dir("bench_checkpoint_dir");
  std::ofstream(dir + "/mine.txt") << "keep me";
  auto r = testing::run_command("bench_checkpoint_dir_run",
                                {DTORCH_CLI, "bench", "checkpoint", "--dir", dir, "--steps", "2",
                                 "--save-at", "1", "--seq-len", "16"},
                                120);
  EXPECT_NE(r.exit_code(), 0);
  EXPECT_TRUE(testing::contains(r.err, "is not empty")) << r.err;
  EXPECT_TRUE(paths::exists(dir + "/mine.txt"));
}

// A pipeline is named before any rank starts, not by four ranks failing in parallelize.
TEST(BenchCheckpoint, APipelineIsRefusedAtOnce) {
  auto r = testing::run_command(
      "bench_checkpoint_pp",
      {DTORCH_CLI, "bench", "checkpoint", "--pp", "2", "--nproc-per-node", "2"}, 60);
  EXPECT_NE(r.exit_code(), 0);
  EXPECT_TRUE(testing::contains(r.err, "without a pipeline; got --pp 2")) << r.err;
  EXPECT_FALSE(testing::contains(r.err, "[n0 r")) << r.err;
}

}  // namespace
}  // namespace dtorch
