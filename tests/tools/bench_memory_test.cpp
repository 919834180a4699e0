// `dtorch bench memory`: each rank's model-state bytes under every strategy match the ZeRO
// paper's formulas for fp32 AdamW within 10%, and sharding really shrinks what a rank holds;
// its stdout is JSON lines only.
#include <gtest/gtest.h>

#include <torch/version.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <set>

#include "support/command.h"
#include "support/workers.h"

namespace dtorch {
namespace {

// gpt-debug at 16 tokens, or `model` at `seq_len` with `more` flags.
std::vector<nlohmann::json> run_bench(const std::string& strategy, int n,
                                      const std::vector<std::string>& more = {},
                                      const std::string& model = "gpt-debug",
                                      const std::string& seq_len = "16") {
  std::vector<std::string> args = {DTORCH_CLI,
                                   "bench",
                                   "memory",
                                   "--model",
                                   model,
                                   "--strategy",
                                   strategy,
                                   "--nproc-per-node",
                                   std::to_string(n),
                                   "--steps",
                                   "2",
                                   "--seq-len",
                                   seq_len};
  args.insert(args.end(), more.begin(), more.end());
  auto r = testing::run_command("bench_memory_" + strategy, args, 180);
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  std::vector<nlohmann::json> rows;
  std::istringstream in(r.out);
  // Every stdout line is one rank's JSON as it is, no launcher prefix: it pipes into jq.
  for (std::string line; std::getline(in, line);) {
    EXPECT_TRUE(nlohmann::json::accept(line)) << line;
    if (nlohmann::json::accept(line)) rows.push_back(nlohmann::json::parse(line));
  }
  EXPECT_EQ(static_cast<int>(rows.size()), n) << r.out;
  return rows;
}

TEST(BenchMemory, InterleavedStagesWithoutBlocksRecomputeNothing) {
  // gpt-debug's 4 units over 2 ranks x 2 virtual stages: each stage holds one unit, so the
  // embedding's and the head's stages hold no block to recompute. Two untimed steps before the
  // two timed ones (plan --validate's): only the timed ones are reported.
  const auto rows =
      run_bench("ddp", 2,
                {"--pp", "2", "--schedule", "interleaved", "--microbatches", "2",
                 "--activation-checkpointing", "1", "--batch-size", "2", "--warmup-steps", "2"});
  for (const auto& row : rows) {
    EXPECT_EQ(row["schedule"], "interleaved") << row.dump();
    EXPECT_EQ(row["timed_step_seconds"].size(), 2u) << row.dump();
  }
}

TEST(BenchMemory, StepCountsBelowOneAreRefusedWithTheValuesGiven) {
  auto r = testing::run_command(
      "bench_memory_bad_counts",
      {DTORCH_CLI, "bench", "memory", "--warmup-steps", "0", "--steps", "2"}, 60);
  EXPECT_NE(r.exit_code(), 0);
  EXPECT_TRUE(testing::contains(r.err, "--warmup-steps")) << r.err;
  EXPECT_TRUE(testing::contains(r.err, "(got 1, 1, 0, 2, 2, 64, 0 and 0)")) << r.err;
  EXPECT_FALSE(testing::contains(r.err, ".cpp:")) << r.err;
}

// --profile writes each rank's Chrome/Perfetto trace with dtorch's own ranges in it: the step's
// phases and every gradient bucket's allreduce (launched, and waited for). Debian's LibTorch
// 1.13 has no Kineto: there the run is refused before any work, naming the version.
TEST(BenchMemory, ProfileWritesATraceWithDtorchsRangesPerRank) {
  const std::string out = testing::scratch_dir("bench-memory-profile");
  auto r = testing::run_command("bench_memory_profile",
                                {DTORCH_CLI, "bench", "memory", "--model", "gpt-debug",
                                 "--strategy", "ddp", "--nproc-per-node", "2", "--steps", "2",
                                 "--seq-len", "16", "--profile", "2:3", "--out", out},
                                180);
  if (TORCH_VERSION_MAJOR < 2) {
    EXPECT_NE(r.exit_code(), 0);
    EXPECT_TRUE(testing::contains(r.err, "needs a LibTorch built with the Kineto profiler"))
        << r.err;
    EXPECT_TRUE(testing::contains(r.err, TORCH_VERSION)) << r.err;
    EXPECT_FALSE(testing::contains(r.err, ".cpp:")) << r.err;
    return;
  }
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  for (int rank : {0, 1}) {
    const std::string path = out + "/trace.rank" + std::to_string(rank) + ".json";
    std::ifstream in(path);
    ASSERT_TRUE(in.good()) << path << " was not written: " << r.err;
    const nlohmann::json trace = nlohmann::json::parse(in, nullptr, false);
    ASSERT_TRUE(trace.is_object() && trace.contains("traceEvents")) << path;
    std::set<std::string> names;
    for (const auto& ev : trace["traceEvents"])
      if (ev.contains("name") && ev["name"].is_string())
        names.insert(ev["name"].get<std::string>());
    for (const char* phase : {"forward", "backward", "optimizer"})
      EXPECT_TRUE(names.count(phase)) << path << " has no range named " << phase;
    auto has = [&](const std::string& part) {
      for (const auto& n : names)
        if (n.find(part) != std::string::npos) return true;
      return false;
    };
    EXPECT_TRUE(has("allreduce #")) << path << ": no gradient allreduce launched";
    EXPECT_TRUE(has("wait allreduce #")) << path << ": no wait for one";
    EXPECT_TRUE(has("DDP gradient bucket")) << path;
  }
  // A range that ends past the run's steps, or is not FIRST:LAST, is refused before any work.
  for (const std::string& bad : {"3:9", "4", "0:2", "3:2"}) {
    auto refused = testing::run_command(
        "bench_memory_profile_bad",
        {DTORCH_CLI, "bench", "memory", "--steps", "2", "--profile", bad, "--out", out}, 60);
    EXPECT_NE(refused.exit_code(), 0) << bad;
    EXPECT_TRUE(testing::contains(refused.err, "--profile")) << bad << ": " << refused.err;
    EXPECT_FALSE(testing::contains(refused.err, ".cpp:")) << refused.err;
  }
}

TEST(BenchMemory, ModelStateMatchesZeroFormulasAtFourRanks) {
  const int n = 4;
  std::map<std::string, double> state;
  for (std::string s : {"ddp", "zero1", "zero2", "zero3"}) {
    for (const auto& row : run_bench(s, n)) {
      const double P = row["params"].get<double>();
      EXPECT_NEAR(row["model_state_over_formula"].get<double>(), 1.0, 0.1) << s << " " << row;
      EXPECT_GT(row["peak_rss_bytes"].get<double>(), row["model_state_bytes"].get<double>());
      // Optimizer state: Adam's two moments, whole for DDP, a 1/N shard otherwise (+ padding).
      const double optim = row["optim_bytes"].get<double>();
      EXPECT_NEAR(optim, s == "ddp" ? 8 * P : 8 * P / n, 0.05 * optim) << s;
      state[s] = row["model_state_bytes"].get<double>();
      // Each timed step's seconds, which plan --validate takes the median of: two steps here,
      // together no longer than the timed window (which ends after a barrier).
      const auto each = row["timed_step_seconds"].get<std::vector<double>>();
      ASSERT_EQ(each.size(), 2u) << row;
      EXPECT_GT(each[0], 0);
      EXPECT_GT(each[1], 0);
      EXPECT_DOUBLE_EQ(row["step_seconds_median"].get<double>(), (each[0] + each[1]) / 2);
      EXPECT_LE(each[0] + each[1], 2 * row["step_seconds"].get<double>() + 1e-6) << row;
    }
  }
  EXPECT_LT(state["zero1"], state["ddp"]);
  EXPECT_LT(state["zero2"], state["zero1"]);
  EXPECT_LT(state["zero3"], state["zero2"]);
}

// --offload-optimizer nvme: the optimizer's moments are counted on the disk, not in memory.
TEST(BenchMemory, OffloadedStateIsCountedOnDisk) {
  const std::string dir = testing::scratch_dir("bench_memory_offload");
  for (const auto& row :
       run_bench("zero3", 2, {"--offload-optimizer", "nvme", "--offload-dir", dir})) {
    const double P = row["params"].get<double>();
    const auto& place = row["model_state_by_place"];
    EXPECT_NEAR(place["nvme"].get<double>(), 8 * P / 2, 0.05 * 8 * P / 2) << row;
    EXPECT_EQ(row["optim_bytes"].get<double>(), 0) << row;
    EXPECT_EQ(place["host"], row["model_state_bytes"]) << row;
    EXPECT_EQ(place["device"].get<double>(), 0) << row;
  }
}

// --cp: the attention bytes each rank sends are Note [Ring attention]'s and Note [Ulysses]'s
// count exactly, and what a rank keeps from forward to backward falls as 1/cp.
TEST(BenchMemory, ContextParallelBytesAreTheFormulaAndActivationsFall) {
  std::map<int, double> kept;
  for (const char* kind : {"ring", "ulysses"}) {
    for (int n : {2, 4}) {
      for (const auto& row :
           run_bench("ddp", n, {"--cp", std::to_string(n), "--cp-kind", kind}, "gpt-long", "128")) {
        EXPECT_EQ(row["cp_bytes_sent_per_step"], row["cp_formula_bytes_per_step"]) << row;
        EXPECT_GT(row["cp_bytes_sent_per_step"].get<int64_t>(), 0) << row;
        EXPECT_EQ(row["tokens_per_rank"], 128 / n) << row;
        if (std::string(kind) == "ring")
          kept[n] = std::max(kept[n], row["forward_kept_bytes"].get<double>());
      }
    }
  }
  EXPECT_NEAR(kept[4] / kept[2], 0.5, 0.1) << kept[2] << " " << kept[4];
}

}  // namespace
}  // namespace dtorch
