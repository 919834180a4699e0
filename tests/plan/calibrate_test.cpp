// Calibration's pure parts without processes: the job's ranks by node, the median, ring
// attention's own work recovered from timings made up from known terms, the benches; and its
// measurements on 2 real ranks over Gloo, on the quick bench: each part (the offload folder's disk
// among them), and whole calibrations of several rounds whose medians make the machine (the
// CLI's tests run one round).
#include "dtorch/plan/calibrate.h"

#include <gtest/gtest.h>

#include "dtorch/comm/communicator.h"
#include "dtorch/core/error.h"
#include "dtorch/core/paths.h"
#include "dtorch/plan/cost_model.h"
#include "support/error_of.h"
#include "support/workers.h"

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

// A tenth of the time, tiny sizes and one round, but every field the CPU's bench measures, rows
// fewest first.
TEST(Calibrate, QuickBenchIsSmallerAndMeasuresAsMuch) {
  const Bench full = bench_for(at::kCPU), quick = bench_for(at::kCPU, true);
  EXPECT_LT(quick.seconds, full.seconds);
  EXPECT_EQ(quick.rounds, 1);
  EXPECT_LT(quick.lockstep_trials, full.lockstep_trials);
  EXPECT_LE(quick.square, full.square);
  EXPECT_LE(quick.width, full.width);
  // A collective's time at 1 MiB per rank was mostly noise: bandwidths of 10^15 bytes/s.
  EXPECT_EQ(quick.large_floats, full.large_floats);
  EXPECT_LT(quick.first_touch_floats, full.first_touch_floats);
  ASSERT_GE(quick.rows.size(), 3u);
  for (size_t i = 1; i < quick.rows.size(); ++i)
    EXPECT_LT(quick.rows[i - 1], quick.rows[i]);
  EXPECT_EQ(quick.ring_tokens, full.ring_tokens);
  EXPECT_TRUE(bench_for(at::Device(at::kCUDA, 0), true).device.is_cuda());
}

// Each part on both ranks at once (they must call the same collectives), then whole calibrations.
DTORCH_TEST_WORKER(calibrate_parts) {
  auto world = comm::Communicator::from_env();
  const Bench bench = bench_for(at::kCPU, true);
  const ComputeRates first = compute_rates(*world, bench, nullptr);
  DTORCH_CHECK(first.flops.at("fp32") > 0 && first.conv.at("fp32") > 0, "no fp32 rates");
  DTORCH_CHECK(first.adamw > 0 && first.first_touch >= 0, "no AdamW or first-touch time");
  const std::vector<RowsRate>& rows = first.by_rows.at("fp32");
  DTORCH_CHECK(!rows.empty() && rows.front().rows == bench.rows.front(), "no rate by rows");
  for (size_t i = 0; i < rows.size(); ++i)
    DTORCH_CHECK(rows[i].rows == bench.rows[i] && rows[i].flops > 0, "rows ", i);
  // A later round measures what the first did, no more.
  const ComputeRates again = compute_rates(*world, bench, &first);
  for (const auto& [dtype, rates] : first.by_rows)
    DTORCH_CHECK(again.by_rows.at(dtype).size() == rates.size(), dtype, " rows measured again");
  DTORCH_CHECK(again.flops.size() == first.flops.size(), "other dtypes the second round");
  for (Collective op :
       {Collective::AllReduce, Collective::ReduceScatter, Collective::AllGather, Collective::P2P}) {
    const LinkCost l = link_cost(*world, bench, op);
    DTORCH_CHECK(l.ranks == 2 && l.latency_s > 0 && l.bus_bytes_per_s > 0, collective_name(op));
  }
  const RingSeconds ring = ring_attention_seconds(world, bench);
  DTORCH_CHECK(ring.both.size() == 2 && ring.forward > 0 && ring.forward < ring.both[0],
               "ring attention ", ring.forward, " of ", ring.both.at(0));
  DTORCH_CHECK(lockstep_fraction(*world, world.get(), bench) >= 0, "a negative lockstep");
  // A rank of no pair never meets: its timings each way are the same work.
  DTORCH_CHECK(lockstep_fraction(*world, nullptr, bench) >= 0, "a negative lockstep alone");
  // The offload folder's disk, each rank through a file of its own that leaves nothing behind.
  const std::string& disk_dir = args.at(0);
  Bench on_disk = bench;
  on_disk.offload_dir = disk_dir;
  const OffloadDisk disk = offload_disk(*world, on_disk);
  DTORCH_CHECK(disk.measured() && disk.dir == disk_dir, "the disk's rate ", disk.state_bytes_per_s);
  world->barrier("disk measured");
  DTORCH_CHECK(paths::list_directory(disk_dir).empty(), "files left in ", disk_dir);
  // Whole, over three rounds: rank 0 gets the machine, with each rate the rounds' median.
  Bench rounds = on_disk;
  rounds.rounds = 3;
  const std::optional<Machine> m = calibrate(world, rounds, 1e6);
  DTORCH_CHECK(m.has_value() == (world->rank() == 0), "the machine on rank ", world->rank());
  if (!m) return;
  DTORCH_CHECK(m->ranks_per_node == 2 && m->device == "cpu" && m->base_bytes_per_rank == 1e6,
               m->name);
  DTORCH_CHECK(m->flops("fp32", 64) > 0 && m->convolution_flops("fp32") > 0, m->name);
  DTORCH_CHECK(m->intra_node.at(Collective::AllReduce).size() == 1 && m->inter_node.empty(),
               "collectives within the node alone");
  DTORCH_CHECK(m->ring_attention.forward_share > 0 && m->lockstep_fraction >= 0, m->name);
  DTORCH_CHECK(m->offload_disk.measured() && m->offload_disk.dir == disk_dir, "the disk's rates");
}

TEST(PlanCalibrate, MeasuresEachPartAndTheMediansOfRoundsOnTwoRanks) {
  const std::string disk = testing::scratch_dir("calibrate_disk");
  EXPECT_EQ(testing::run_ranks(2, "calibrate_parts", {disk}, 120), 0);
}

}  // namespace
}  // namespace dtorch::plan
