// train::bench_memory called as a library on 2 real ranks, without the command line: each rank's
// line names it, has as many timed steps as asked, and ZeRO-2's state matches the ZeRO paper's
// formula for fp32 AdamW (tests/tools/bench_memory_test.cpp runs every layout through the CLI).
#include "dtorch/train/bench_memory.h"

#include <gtest/gtest.h>

#include <cmath>

#include "dtorch/comm/communicator.h"
#include "dtorch/core/error.h"
#include "dtorch/train/strategy/strategy.h"
#include "support/workers.h"

namespace dtorch::train {
namespace {

DTORCH_TEST_WORKER(bench_memory_library) {
  auto world = comm::Communicator::from_env();
  BenchMemoryConfig c;
  c.strategy.kind = StrategyKind::Zero2;
  c.strategy.optimizer.kind = OptimizerKind::AdamW;
  c.seq_len = 16;
  c.steps = 2;
  const nlohmann::json j = bench_memory(c, world);
  DTORCH_CHECK(j.at("rank") == world->rank() && j.at("nproc") == 2, "not this rank's: ", j);
  DTORCH_CHECK(j.at("strategy") == "zero2" && j.at("model") == "gpt-debug", j);
  DTORCH_CHECK(j.at("timed_step_seconds").size() == 2, "not 2 timed steps: ", j);
  DTORCH_CHECK(j.at("step_seconds_median").get<double>() > 0, j);
  const double over = j.at("model_state_over_formula").get<double>();
  DTORCH_CHECK(std::abs(over - 1) <= 0.1, "model state ", over, " x the ZeRO formula: ", j);
  DTORCH_CHECK(j.contains("phase_seconds") && !j.contains("pp"), "no pipeline: ", j);
}

TEST(BenchMemory, MeasuresOneLayoutOnEachRankAsALibrary) {
  EXPECT_EQ(testing::run_ranks(2, "bench_memory_library", {}, 120), 0);
}

}  // namespace
}  // namespace dtorch::train
