// `dtorch bench memory`: each rank's model-state bytes under every strategy match the ZeRO
// paper's formulas for fp32 AdamW within 10%, and sharding really shrinks what a rank holds;
// its stdout is JSON lines only.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "support/command.h"

namespace dtorch {
namespace {

std::vector<nlohmann::json> run_bench(const std::string& strategy, int n) {
  auto r = testing::run_command(
      "bench_memory_" + strategy,
      {DTORCH_CLI, "bench", "memory", "--model", "gpt-debug", "--strategy", strategy,
       "--nproc-per-node", std::to_string(n), "--steps", "2", "--seq-len", "16"},
      180);
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
    }
  }
  EXPECT_LT(state["zero1"], state["ddp"]);
  EXPECT_LT(state["zero2"], state["zero1"]);
  EXPECT_LT(state["zero3"], state["zero2"]);
}

}  // namespace
}  // namespace dtorch
