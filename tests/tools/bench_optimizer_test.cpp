// `dtorch bench optimizer`: one JSON line with every timed step of AdamW over the shards given;
// with the state on disk (--offload-dir) the same steps end at the same parameters as in memory,
// and the file goes with the run; shards of no parameters are refused, naming the flag.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "dtorch/core/paths.h"
#include "support/command.h"
#include "support/workers.h"

namespace dtorch {
namespace {

nlohmann::json run_optimizer_bench(const std::string& name, const std::vector<std::string>& extra) {
  std::vector<std::string> args = {DTORCH_CLI, "bench", "optimizer", "--shards", "1000,70000",
                                   "--steps",  "3",     "--warmup",  "2"};
  args.insert(args.end(), extra.begin(), extra.end());
  auto r = testing::run_command(name, args, 60);
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  return nlohmann::json::parse(r.out.substr(0, r.out.find('\n')));
}

TEST(BenchOptimizer, TheStateOnDiskStepsAsInMemory) {
  const nlohmann::json memory = run_optimizer_bench("bench_optimizer_memory", {});
  EXPECT_EQ(memory.at("parameters").get<int64_t>(), 71000);
  EXPECT_EQ(memory.at("state"), "memory");
  EXPECT_EQ(memory.at("step_seconds").size(), 3u);
  EXPECT_GT(memory.at("step_seconds_median").get<double>(), 0);
  const std::string disk = testing::scratch_dir("bench_optimizer_disk");
  const nlohmann::json offloaded =
      run_optimizer_bench("bench_optimizer_nvme", {"--offload-dir", disk});
  EXPECT_EQ(offloaded.at("state"), "nvme");
  // Five steps of AdamW from the same seed: the same parameters, wherever the moments lived.
  EXPECT_EQ(offloaded.at("checksum").get<double>(), memory.at("checksum").get<double>());
  EXPECT_TRUE(paths::list_directory(disk).empty());
  auto bad = testing::run_command("bench_optimizer_bad",
                                  {DTORCH_CLI, "bench", "optimizer", "--shards", "1000,0"}, 60);
  EXPECT_NE(bad.exit_code(), 0);
  EXPECT_TRUE(testing::contains(bad.err, "a shard of 0 parameters: give each 1 or more (--shards)"))
      << bad.err;
  EXPECT_FALSE(testing::contains(bad.err, ".cpp:")) << bad.err;
}

}  // namespace
}  // namespace dtorch
