// Calibration's pure parts without processes: the job's ranks by node, the median, and ring
// attention's own work recovered from timings made up from known terms.
#include "dtorch/plan/calibrate.h"

#include <gtest/gtest.h>

#include "dtorch/core/error.h"
#include "dtorch/plan/cost_model.h"
#include "support/error_of.h"

namespace dtorch::plan {
namespace {

TEST(Calibrate, RanksByNodeKeepRankZerosNodeFirst) {
  EXPECT_EQ(ranks_by_node({0, 0, 1, 1}), (std::vector<std::vector<int>>{{0, 1}, {2, 3}}));
  // Nodes as a launcher numbers them, rank 0 on node 1, ranks interleaved.
  EXPECT_EQ(ranks_by_node({1, 0, 1, 0}), (std::vector<std::vector<int>>{{0, 2}, {1, 3}}));
  EXPECT_EQ(ranks_by_node({0, 0}), (std::vector<std::vector<int>>{{0, 1}}));
  const std::string e = testing::error_of<ConfigError>([] { ranks_by_node({0, 0, 0, 1}); });
  EXPECT_NE(e.find("the nodes run different numbers of ranks (3 and 1)"), std::string::npos) << e;
  EXPECT_NE(e.find("--nproc-per-node"), std::string::npos) << e;
}

TEST(Calibrate, MedianIsTheMiddleValue) {
  EXPECT_EQ(median({3, 1, 2}), 2);
  EXPECT_EQ(median({5}), 5);
  EXPECT_EQ(median({4, 1, 3, 2}), 3);  // the upper of the two middle ones
}

// A machine for ring attention in round numbers: 1 GFLOP/s, 1 GB/s with 10 us per message.
Machine ring_machine() {
  Machine m;
  m.matmul_flops["fp32"] = 1e9;
  m.intra_node[Collective::P2P] = {{2, 1e-5, 1e9}};
  return m;
}

// Timings made of the cost model's charge for the layer's FLOPs and messages plus a known time
// per ring step and per score give those two back, and the forward's share of the layer.
TEST(Calibrate, RingAttentionCostRecoversItsStepAndScoreTimes) {
  const Machine m = ring_machine();
  const Bench bench = bench_for(at::kCPU);
  ASSERT_EQ(bench.ring_tokens.size(), 2u);
  const double step_s = 2e-4, score_s = 3e-9;
  RingSeconds measured;
  for (int64_t tokens : bench.ring_tokens) {
    const AttentionShape layer{1, bench.ring_heads, tokens, bench.ring_head_dim, 2, 4};
    const RingAttentionTime charged = ring_attention_time(m, layer, false, false);
    // A ring of 2 takes 2 steps.
    measured.both.push_back(charged.attention_s + charged.exposed_s + 2 * step_s +
                            score_s * attention_scores(layer));
  }
  measured.forward = 0.4 * measured.both[0];
  const RingAttentionCost c = ring_attention_cost(measured, bench, m);
  EXPECT_NEAR(c.step_seconds, step_s, 1e-9);
  EXPECT_NEAR(c.seconds_per_score, score_s, 1e-13);
  EXPECT_NEAR(c.forward_share, 0.4, 1e-12);
  // A layer faster than its charge has no own work, and a forward share of at most 1.
  RingSeconds fast{{1e-9, 2e-9}, 5e-9};
  const RingAttentionCost none = ring_attention_cost(fast, bench, m);
  EXPECT_EQ(none.step_seconds, 0);
  EXPECT_EQ(none.seconds_per_score, 0);
  EXPECT_EQ(none.forward_share, 1);
}

// A GPU's bench measures larger products and buffers than a CPU's, each at rows fewest first.
TEST(Calibrate, BenchForAGpuIsLarger) {
  const Bench cpu = bench_for(at::kCPU), gpu = bench_for(at::Device(at::kCUDA, 0));
  EXPECT_TRUE(gpu.device.is_cuda());
  EXPECT_GT(gpu.square, cpu.square);
  EXPECT_GT(gpu.large_floats, cpu.large_floats);
  EXPECT_GT(gpu.ring_tokens.front(), cpu.ring_tokens.front());
  for (const Bench& b : {cpu, gpu}) {
    ASSERT_GE(b.rows.size(), 3u);
    for (size_t i = 1; i < b.rows.size(); ++i)
      EXPECT_LT(b.rows[i - 1], b.rows[i]);
    EXPECT_LT(b.ring_tokens[0], b.ring_tokens[1]);
  }
}

}  // namespace
}  // namespace dtorch::plan
