// `dtorch train` with the optimizer's state and the parameter shards on disk (Note [Optimizer
// state on disk], Note [Parameters on disk]), as a user runs it: ZeRO-3 at 2 ranks with
// --offload-optimizer nvme --offload-params nvme trains, saves and resumes exactly as
// the same run with its state in memory (its checkpoint written in the background too), records
// the setting in config.json, and leaves no file in the folder; its checkpoint resumes at another
// world size and strategy as the other's does.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "dtorch/core/paths.h"
#include "support/command.h"
#include "support/train_run.h"
#include "support/workers.h"

namespace dtorch {
namespace {

using testing::with;

TEST(TrainOffload, StateAndShardsOnDiskTrainAndResumeBitForBit) {
  const std::string dir = testing::scratch_dir("train_offload");
  auto r = testing::run_command("offload_memory",
                                testing::gpt_debug_train_args(dir + "/memory", "zero3", 2), 300);
  ASSERT_EQ(r.exit_code(), 0) << r.err;

  const std::string nvme = dir + "/nvme";
  ASSERT_TRUE(paths::create_directory(nvme));
  const std::vector<std::string> offload{"--offload-optimizer", "nvme", "--offload-params",  "nvme",
                                         "--offload-dir",       nvme,   "--offload-buffers", "2",
                                         "--offload-buffer-mb", "1"};
  // Its checkpoint written in the background, from a copy of the state on disk.
  r = testing::run_command("offload_first",
                           with(testing::gpt_debug_train_args(dir + "/disk", "zero3", 2, 1),
                                with(offload, {"--async-checkpoint"})),
                           300);
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_TRUE(testing::contains(r.err, "optimizer state on disk in " + nvme)) << r.err;
  EXPECT_TRUE(testing::contains(r.err, "parameter shards on disk there too")) << r.err;
  // gpt-debug's largest shard is smaller than the 1 MiB a buffer may hold.
  EXPECT_TRUE(testing::contains(r.err, " KiB)")) << r.err;
  r = testing::run_command(
      "offload_resumed",
      with(testing::gpt_debug_train_args(dir + "/disk", "zero3", 2), with(offload, {"--resume"})),
      300);
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_TRUE(testing::contains(r.err, "resuming from")) << r.err;

  auto want = testing::model_file(dir + "/memory/model.pt");
  auto got = testing::model_file(dir + "/disk/model.pt");
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, t] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    EXPECT_TRUE(got[name].equal(t)) << name;
  }
  auto a = testing::epochs_of(dir + "/memory"), b = testing::epochs_of(dir + "/disk");
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  for (size_t e = 0; e < a.size(); ++e)
    EXPECT_EQ(a[e]["test_loss"], b[e]["test_loss"]) << "epoch " << e + 1;
  EXPECT_TRUE(paths::list_directory(nvme).empty()) << "a file left in " << nvme;

  nlohmann::json config;
  std::ifstream(dir + "/disk/config.json") >> config;
  EXPECT_EQ(config["parallelism"]["offload-optimizer"], "nvme") << config.dump();
  EXPECT_EQ(config["parallelism"]["offload-params"], "nvme") << config.dump();
  EXPECT_EQ(config["parallelism"]["offload-buffer-mb"], 1) << config.dump();

  // Its checkpoint is ZeRO's own: both runs go on for a third epoch at 1 rank under zero1,
  // resharded, and end alike.
  for (const std::string run : {"memory", "disk"}) {
    r = testing::run_command(
        "offload_resharded_" + run,
        with(testing::gpt_debug_train_args(dir + "/" + run, "zero1", 1, 3), {"--resume"}), 300);
    ASSERT_EQ(r.exit_code(), 0) << r.err;
    EXPECT_TRUE(testing::contains(r.err, "resuming from")) << r.err;
    EXPECT_EQ(testing::epochs_of(dir + "/" + run).size(), 3u) << run;
  }
  want = testing::model_file(dir + "/memory/model.pt");
  got = testing::model_file(dir + "/disk/model.pt");
  for (const auto& [name, t] : want)
    EXPECT_TRUE(got[name].equal(t)) << "resharded: " << name;
}

}  // namespace
}  // namespace dtorch
