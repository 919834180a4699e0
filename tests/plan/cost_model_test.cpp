// The cost model (Note [Cost model]) without processes: a GPT's and a ViT's units as the
// registry counts them, a CNN's measured FLOPs and kept bytes against hand counts, each term
// against the same sum made by hand, the memory ordering ZeRO promises, the pipeline's bubble
// shrinking with micro-batches, the optimizer's state on disk, every enumerated layout one the run
// configuration accepts, and machine files read, refused and written back.
#include "dtorch/plan/cost_model.h"

#include <gtest/gtest.h>

#include <fstream>

#include "dtorch/core/error.h"
#include "dtorch/models/registry.h"
#include "dtorch/parallel/pp/stage_plan.h"
#include "dtorch/report/out_of_memory.h"
#include "support/command.h"
#include "support/error_of.h"
#include "support/workers.h"

namespace dtorch::plan {
namespace {

// A machine with round numbers: 1 GFLOP/s, 1 GB/s links with 10 us per step, 1 GiB per rank.
Machine round_machine(int ranks_per_node = 8) {
  Machine m;
  m.name = "round";
  m.ranks_per_node = ranks_per_node;
  m.memory_per_rank_bytes = double(1 << 30);
  m.matmul_flops["fp32"] = 1e9;
  for (Collective c :
       {Collective::AllReduce, Collective::ReduceScatter, Collective::AllGather, Collective::P2P})
    m.intra_node[c] = {{2, 1e-5, 1e9}};
  return m;
}

TEST(CostModel, GptUnitsAreTheRegistrys) {
  const Workload w = workload_of("gpt-debug", 0, 8);
  EXPECT_EQ(w.seq_len, 32);
  EXPECT_EQ(w.layers, 2);
  const auto units = models::model_units("gpt-debug");
  ASSERT_EQ(units.size(), w.unit_parameters.size());
  for (size_t i = 0; i < units.size(); ++i)
    EXPECT_EQ(units[i].parameters, w.unit_parameters[i]) << units[i].name;
  const std::string e = testing::error_of<ConfigError>([] { workload_of("gpt-tiny", 0, 8); });
  EXPECT_NE(e.find("unknown model 'gpt-tiny'"), std::string::npos) << e;
}

// A CNN's units measured: each layer's FLOPs from its output, against the layer shapes counted by
// hand; the bytes forward keeps against what autograd saves, counted by hand; its layouts without
// tensor or context parallelism, and mnist-cnn's (one unit, no blocks) without a pipeline or
// recomputation.
TEST(CostModel, CnnUnitsAreMeasuredLayerByLayer) {
  const Workload cnn = workload_of("mnist-cnn", 0, 4);
  ASSERT_EQ(cnn.unit_work.size(), 1u);
  EXPECT_EQ(cnn.layers, 0);
  EXPECT_EQ(cnn.unit_parameters[0], models::model_parameters("mnist-cnn"));
  const UnitWork& u = cnn.unit_work[0];
  // conv1 1 -> 32 at 26 x 26, conv2 32 -> 64 at 24 x 24, both 3 x 3; fc1 9216 -> 128, fc2 -> 10.
  EXPECT_DOUBLE_EQ(u.conv_flops, 2.0 * (26 * 26 * 32 * 9 + 24 * 24 * 64 * 32 * 9));
  EXPECT_DOUBLE_EQ(u.matmul_flops, 2.0 * (9216 * 128 + 128 * 10));
  // Autograd keeps the two ReLUs' outputs, the max-pool's output and its int64 indices, fc1's
  // ReLU's output and the logits (each linear's input is one of these).
  const double kept = 4.0 * (32 * 26 * 26 + 64 * 24 * 24 + 9216 + 128 + 10) + 8.0 * 9216;
  EXPECT_NEAR(u.kept_bytes, kept, 0.1 * kept);
  // Backward makes the gradient of conv1's output at least, and less than forward kept.
  EXPECT_GE(u.backward_bytes, 4.0 * 32 * 26 * 26);
  EXPECT_LT(u.backward_bytes, kept);
  EXPECT_DOUBLE_EQ(u.output_bytes, 40);
  for (const Layout& l : enumerate_layouts(cnn, 2)) {
    EXPECT_EQ(l.tp * l.pp * l.cp, 1);
    EXPECT_FALSE(l.activation_checkpointing);
  }
  EXPECT_EQ(enumerate_layouts(cnn, 2).size(), 4u);  // ddp, zero1-3

  const Workload res = workload_of("resnet-debug", 0, 8);
  const auto units = models::model_units("resnet-debug");
  ASSERT_EQ(res.unit_work.size(), units.size());  // stem, layer1-4, head
  for (size_t i = 0; i < units.size(); ++i)
    EXPECT_EQ(units[i].parameters, res.unit_parameters[i]) << units[i].name;
  EXPECT_EQ(res.layers, 4);
  // layer2: 8 -> 16 planes at 14 x 14, a 3 x 3 conv from 8 and one from 16, the shortcut's 1 x 1.
  EXPECT_DOUBLE_EQ(res.unit_work[2].conv_flops, 2.0 * 14 * 14 * 16 * (8 * 9 + 16 * 9 + 8));
  EXPECT_DOUBLE_EQ(res.unit_work[2].output_bytes, 4.0 * 16 * 14 * 14);
  EXPECT_DOUBLE_EQ(res.unit_work[5].matmul_flops, 2.0 * 64 * 10);
  EXPECT_GT(res.unit_work[1].kept_bytes, 4 * res.unit_work[1].output_bytes);

  Machine m = round_machine();
  std::string e = testing::error_of<ConfigError>([&] { predict(res, m, Layout{}); });
  EXPECT_NE(e.find("no convolution rate for fp32"), std::string::npos) << e;
  m.conv_flops["fp32"] = 1e8;
  double forward = 0, blocks = 0;
  for (const UnitWork& w : res.unit_work) {
    forward += w.conv_flops / 1e8 + w.matmul_flops / 1e9;
    if (w.block) blocks += w.conv_flops / 1e8;
  }
  EXPECT_NEAR(predict(res, m, Layout{}).compute_s, 8 * 3 * forward, 1e-12);
  Layout ac;
  ac.activation_checkpointing = true;
  EXPECT_NEAR(predict(res, m, ac).compute_s, 8 * (3 * forward + blocks), 1e-12);
  EXPECT_LT(predict(res, m, ac).activation_bytes, predict(res, m, Layout{}).activation_bytes);
  bool pp2 = false;
  for (const Layout& l : enumerate_layouts(res, 4)) {
    EXPECT_EQ(l.tp * l.cp, 1);
    pp2 |= l.pp == 2;
  }
  EXPECT_TRUE(pp2);
  Layout l;
  l.dp = 2, l.zero = 1;
  EXPECT_EQ(flags_of(l, res), "--model resnet-debug --batch-size 4 --strategy zero1");

  // resnet18 cut in two by parameters: the stages, not the slowest, hold the peak: layer4 holds
  // three quarters of the parameters and a third of the FLOPs.
  const Workload big = workload_of("resnet18", 0, 4);
  Layout two;
  two.pp = 2, two.microbatches = 2;
  const pp::StagePlan stages = pp::balance_stages(big.unit_parameters, 2);
  ASSERT_GT(stages.parameters[1], 2 * stages.parameters[0]);
  EXPECT_DOUBLE_EQ(predict(big, m, two).model_state_bytes,
                   report::model_state_bytes(0, double(stages.parameters[1]), 1, 0));
  e = testing::error_of<ConfigError>([] { workload_of("resnet18", 64, 4); });
  EXPECT_NE(e.find("drop --seq-len"), std::string::npos) << e;
}

// A ViT's blocks at the matmul rate as a GPT's, its class token's head, and its patch embedding
// (a convolution) at the convolution rate; its layouts have no context parallelism and their
// flags no --seq-len.
TEST(CostModel, VitsPatchEmbeddingRunsAtTheConvolutionRate) {
  const Workload w = workload_of("vit-debug", 0, 4);  // 28 x 28 in 7 x 7 patches
  EXPECT_EQ(w.seq_len, 17);
  const auto units = models::model_units("vit-debug");
  ASSERT_EQ(units.size(), w.unit_parameters.size());
  for (size_t i = 0; i < units.size(); ++i)
    EXPECT_EQ(units[i].parameters, w.unit_parameters[i]) << units[i].name;
  Machine m = round_machine();
  std::string e = testing::error_of<ConfigError>([&] { predict(w, m, Layout{}); });
  EXPECT_NE(e.find("no convolution rate for fp32"), std::string::npos) << e;
  m.conv_flops["fp32"] = 1e8;
  const double C = 32, M = 64, T = 17, L = 2, K = 10;
  const double forward = T * L * (8 * C * C + 4 * C * M + 4 * T * C) + 2 * C * K;
  const double patches = 2 * 16 * C * 49;  // one channel, 7 x 7 each
  EXPECT_NEAR(predict(w, m, Layout{}).compute_s, 4 * 3 * (forward / 1e9 + patches / 1e8), 1e-12);
  bool tp2 = false;
  for (const Layout& l : enumerate_layouts(w, 4)) {
    EXPECT_EQ(l.cp, 1);
    tp2 |= l.tp == 2;
  }
  EXPECT_TRUE(tp2);
  Layout l;
  l.dp = 2, l.zero = 1;
  EXPECT_EQ(flags_of(l, w), "--model vit-debug --batch-size 2 --strategy zero1");
  e = testing::error_of<ConfigError>([] { workload_of("vit-debug", 64, 4); });
  EXPECT_NE(e.find("drop --seq-len"), std::string::npos) << e;
}

TEST(CostModel, CollectiveTimeIsLatencyPerStepPlusBusBytesOverBandwidth) {
  Machine m = round_machine();
  m.intra_node[Collective::AllReduce] = {{2, 1e-5, 1e9}, {4, 2e-5, 5e8}};
  // 4 ranks: the 4-rank measurement; 2 (n-1) steps, 2 (n-1)/n of the bytes.
  EXPECT_DOUBLE_EQ(m.seconds(Collective::AllReduce, 4, 1e8, false), 6 * 2e-5 + 1.5e8 / 5e8);
  // 3 ranks: the largest measured group no larger, 2 ranks'.
  EXPECT_DOUBLE_EQ(m.seconds(Collective::AllReduce, 3, 1e8, false),
                   4 * 1e-5 + (4.0 / 3) * 1e8 / 1e9);
  EXPECT_DOUBLE_EQ(m.seconds(Collective::AllGather, 2, 1e8, false), 1e-5 + 0.5e8 / 1e9);
  EXPECT_EQ(m.seconds(Collective::AllReduce, 1, 1e8, false), 0);
  const std::string e = testing::error_of<ConfigError>(
      [&] { m.seconds(Collective::AllReduce, 16, 1e8, /*across_nodes=*/true); });
  EXPECT_NE(e.find("no inter_node.allreduce measurement"), std::string::npos) << e;
}

TEST(CostModel, OneRankComputesThreeForwardsOfTheModelsFlops) {
  const Workload w = workload_of("gpt-debug", 32, 4);
  const Machine m = round_machine();
  const double C = 32, T = 32, V = 256, L = 2;
  const double forward = T * (L * (24 * C * C + 4 * T * C) + 2 * C * V);  // per sequence
  const Prediction p = predict(w, m, Layout{});
  EXPECT_NEAR(p.compute_s, 4 * 3 * forward / 1e9, 1e-12);
  EXPECT_EQ(p.exposed_comm_s, 0);
  EXPECT_EQ(p.bubble_s, 0);
  Layout ac;
  ac.activation_checkpointing = true;
  const double blocks = T * L * (24 * C * C + 4 * T * C);
  EXPECT_NEAR(predict(w, m, ac).compute_s, 4 * (3 * forward + blocks) / 1e9, 1e-12);
  // Recomputation keeps a block's input instead of its tensors.
  EXPECT_LT(predict(w, m, ac).activation_bytes, p.activation_bytes);
}

TEST(CostModel, DataParallelPaysItsAllReduceAndZeroShardsTheState) {
  const Workload w = workload_of("gpt-small", 64, 8);
  const Machine m = round_machine();
  double P = -double(w.vocab * w.hidden);  // the tied embedding once
  for (int64_t u : w.unit_parameters)
    P += double(u);
  Layout ddp;
  ddp.dp = 8;
  const Prediction d = predict(w, m, ddp);
  EXPECT_NEAR(d.exposed_comm_s, m.seconds(Collective::AllReduce, 8, 4 * P, false), 1e-9);
  // ZeRO-1 and -2 reduce-scatter the gradients and all-gather the updated parameters.
  const double shards = m.seconds(Collective::ReduceScatter, 8, 4 * P, false) +
                        m.seconds(Collective::AllGather, 8, 4 * P, false);
  // The peak is its parts; ddp holds every gradient as backward makes it and the tied
  // embedding's two gradients that autograd adds into its .grad.
  const double tied = 4.0 * w.vocab * w.hidden;
  EXPECT_NEAR(d.peak_bytes,
              m.base_bytes_per_rank + d.model_state_bytes + d.activation_bytes + d.transient_bytes,
              1);
  EXPECT_NEAR(d.transient_bytes, 4 * P + 2 * tied, 1);
  // ZeRO's state holds no .grad: the tied embedding's counts beside its two copies. ZeRO-2 has
  // two 25 MiB buckets in flight (gpt-small's MLP weight, 9 MiB, is below the cap).
  Layout zero1 = ddp, zero2 = ddp, zero3 = ddp;
  zero1.zero = 1;
  zero2.zero = 2;
  zero3.zero = 3;
  EXPECT_NEAR(predict(w, m, zero1).transient_bytes, 3 * tied, 1);
  EXPECT_NEAR(predict(w, m, zero2).transient_bytes, 3 * tied + 2 * 25.0 * (1 << 20), 1);
  EXPECT_NEAR(predict(w, m, zero3).transient_bytes, 3 * tied, 1);
  // ZeRO-3 holds its shards, its root unit whole with its gradient bucket, and five blocks:
  // gpt-small's root (the parameters outside the blocks, the tied embedding once) is a third of
  // it, so over 8 ranks that is more than ZeRO-2 holds.
  const double root =
      4.0 * double(w.unit_parameters.front() + w.unit_parameters.back() - w.vocab * w.hidden);
  const double block = 4.0 * double(w.unit_parameters.at(1));
  EXPECT_NEAR(predict(w, m, zero3).model_state_bytes, 16 * P / 8 + 2 * root + 5 * block, 1);
  EXPECT_GT(predict(w, m, zero3).model_state_bytes, predict(w, m, zero2).model_state_bytes);
  double last = d.model_state_bytes;
  for (const Layout& z : {zero1, zero2}) {
    const Prediction p = predict(w, m, z);
    EXPECT_LT(p.model_state_bytes, last) << "zero" << z.zero;
    EXPECT_NEAR(p.exposed_comm_s, shards, 1e-9) << "zero" << z.zero;
    last = p.model_state_bytes;
  }
  // The same layout with half its link's bandwidth hidden behind backward.
  Machine hidden = m;
  hidden.overlap["ddp"] = 0.5;
  EXPECT_NEAR(predict(w, hidden, ddp).exposed_comm_s, d.exposed_comm_s / 2, 1e-9);
  // Memory decides fitting.
  Machine small = m;
  small.memory_per_rank_bytes = d.peak_bytes - 1;
  EXPECT_FALSE(predict(w, small, ddp).fits);
}

TEST(CostModel, FewRowsRunSlowerAndFreshMemoryCostsItsFirstTouch) {
  Machine m = round_machine();
  m.matmul_by_rows["fp32"] = {{16, 5e8}, {256, 1e9}};
  EXPECT_DOUBLE_EQ(m.flops("fp32", 8), 5e8);     // the nearest end outside the measured rows
  EXPECT_DOUBLE_EQ(m.flops("fp32", 64), 7.5e8);  // halfway from 16 to 256 in log(rows)
  EXPECT_DOUBLE_EQ(m.flops("fp32", 4096), 1e9);
  EXPECT_DOUBLE_EQ(m.flops("fp32"), 1e9);  // no rows: matmul_flops
  const Workload w = workload_of("gpt-debug", 32, 4);
  const double C = 32, T = 32, V = 256, L = 2;
  const double forward = T * (L * (24 * C * C + 4 * T * C) + 2 * C * V);
  // 4 sequences of 32 tokens: 128 rows, three quarters of the way from 16 to 256.
  EXPECT_NEAR(predict(w, m, Layout{}).compute_s, 4 * 3 * forward / 8.75e8, 1e-12);
  // Backward's fresh bytes: every gradient and the two copies of the tied embedding's.
  double P = -V * C;  // the tied embedding once
  for (int64_t u : w.unit_parameters)
    P += double(u);
  Machine touched = m;
  touched.first_touch_seconds_per_byte = 1e-9;
  EXPECT_NEAR(predict(w, touched, Layout{}).compute_s - predict(w, m, Layout{}).compute_s,
              (4 * P + 2 * 4 * V * C) * 1e-9, 1e-12);
  // ZeRO-3 gathers its units into memory it kept (Note [Spare unit memory]): nothing more.
  Layout zero3;
  zero3.zero = 3;
  EXPECT_NEAR(predict(w, touched, zero3).compute_s - predict(w, m, zero3).compute_s,
              (4 * P + 2 * 4 * V * C) * 1e-9, 1e-12);
}

TEST(CostModel, RingAttentionPaysItsOwnWorkPerStepAndScoreInEveryLayer) {
  Machine m = round_machine();
  const Workload w = workload_of("gpt-debug", 32, 2);  // 2 blocks of 4 heads of 8
  const Layout cp2{1, 1, 1, 2, 1}, recomputed{1, 1, 1, 2, 1, true};
  const Prediction plain = predict(w, m, cp2), plain_ac = predict(w, m, recomputed);
  m.ring_attention = {1e-3, 2e-9, 0.25};
  // Per layer: 2 ring steps, and 2 sequences x 4 heads x 16 of the rank's tokens x 32 scores.
  const double own = 2 * 1e-3 + 2 * 4 * 16 * 32 * 2e-9;
  EXPECT_NEAR(predict(w, m, cp2).compute_s - plain.compute_s, 2 * own, 1e-12);
  // A recomputed forward pays the forward's share again.
  EXPECT_NEAR(predict(w, m, recomputed).compute_s - plain_ac.compute_s, 2 * own * 1.25, 1e-12);
  // The same parts ring_attention_time gives, and its FLOPs as predict charges attention.
  EXPECT_DOUBLE_EQ(attention_scores({2, 4, 16, 8, 2, 4}), 2 * 4 * 16 * 32);
  const RingAttentionTime r = ring_attention_time(m, {2, 4, 16, 8, 2, 4}, false, false);
  EXPECT_NEAR(r.own_s, own, 1e-15);
  EXPECT_NEAR(r.attention_s, 3 * 2 * 4 * 16 * 32 * 32 / 1e9, 1e-15);
  EXPECT_DOUBLE_EQ(predict(w, m, Layout{2, 1, 1, 1, 1}).compute_s,
                   predict(w, round_machine(), Layout{2, 1, 1, 1, 1}).compute_s);
}

TEST(CostModel, MoreMicroBatchesShrinkThePipelinesBubble) {
  const Workload w = workload_of("gpt-debug", 32, 16);
  const Machine m = round_machine();
  Layout l;
  l.pp = 2;
  double last = 1e30;
  for (int mbs : {2, 4, 8}) {
    l.microbatches = mbs;
    const Prediction p = predict(w, m, l);
    EXPECT_GT(p.bubble_s, 0) << mbs;
    EXPECT_LT(p.bubble_s, last) << mbs;
    last = p.bubble_s;
  }
  Layout zb = l;
  zb.schedule = pp::ScheduleKind::ZeroBubble;
  EXPECT_LT(predict(w, m, zb).bubble_s, predict(w, m, l).bubble_s);
}

// The optimizer's state on disk (--offload-optimizer nvme): the rank holds the offload's four
// buffers instead of AdamW's two moments, and the step waits for the disk's reads and writes of
// them where they outlast the AdamW step they overlap. An offload twin is ranked where the layout
// does not fit, or alone when asked for; never without the disk's rates or on a GPU.
// Note [Hybrid sharding]: a replica a node gathers and reduce-scatters over the node's fast
// links and sends only the shards' all-reduce across the slow ones: on 2 nodes of 4 whose links
// between them are 100 times slower, gpt-large's ZeRO-3 with replicas ranks above plain ZeRO-3,
// which holds less.
TEST(CostModel, HybridShardingPaysOnlyItsShardsAllReduceAcrossNodes) {
  const Workload w = workload_of("gpt-large", 64, 8);
  Machine m = round_machine(4);
  m.memory_per_rank_bytes = 1e12;
  for (Collective c :
       {Collective::AllReduce, Collective::ReduceScatter, Collective::AllGather, Collective::P2P})
    m.inter_node[c] = {{2, 1e-4, 1e7}};
  double P = -double(w.vocab * w.hidden);  // the tied embedding once
  for (int64_t u : w.unit_parameters)
    P += double(u);
  Layout plain;
  plain.dp = 8;
  plain.zero = 3;
  Layout hybrid = plain;
  hybrid.dp_replicate = 2;
  const Prediction p = predict(w, m, plain), h = predict(w, m, hybrid);
  EXPECT_NEAR(p.exposed_comm_s,
              m.seconds(Collective::ReduceScatter, 8, 4 * P, true) +
                  2 * m.seconds(Collective::AllGather, 8, 4 * P, true),
              1e-9);
  EXPECT_NEAR(h.exposed_comm_s,
              m.seconds(Collective::ReduceScatter, 4, 4 * P, false) +
                  2 * m.seconds(Collective::AllGather, 4, 4 * P, false) +
                  m.seconds(Collective::AllReduce, 2, 4 * P / 4, true),
              1e-9);
  EXPECT_GT(h.model_state_bytes, p.model_state_bytes) << "shards over 4 ranks, not 8";
  // Where backward hides ZeRO-3's collectives, it does not hide the replicas' allreduce, which
  // each unit's reduction waits for; and where a node's ranks running theirs at once share its
  // links, each runs at the shared rate.
  Machine hides = m;
  hides.overlap["zero3"] = 1.0;
  EXPECT_NEAR(predict(w, hides, hybrid).exposed_comm_s,
              m.seconds(Collective::AllReduce, 2, 4 * P / 4, true), 1e-9);
  hides.inter_node_concurrent[Collective::AllReduce] = {{2, 1e-4, 1e7 / 4}};
  EXPECT_NEAR(predict(w, hides, hybrid).exposed_comm_s,
              4 * m.seconds(Collective::AllReduce, 2, 4 * P / 4, true) - 3 * 2 * 1e-4, 1e-6);
  EXPECT_NE(flags_of(hybrid, w).find("--strategy zero3 --dp-replicate 2"), std::string::npos)
      << flags_of(hybrid, w);
  const std::vector<Prediction> ranked = rank_layouts(w, m, 8);
  auto place = [&](int replicas) {
    for (size_t i = 0; i < ranked.size(); ++i) {
      const Layout& l = ranked[i].layout;
      if (l.zero == 3 && l.dp == 8 && !l.activation_checkpointing && l.dp_replicate == replicas)
        return i;
    }
    return ranked.size();
  };
  EXPECT_LT(place(2), place(1));
  ASSERT_LT(place(1), ranked.size()) << "plain ZeRO-3 is ranked too";
  // Listing only layouts with the optimizer's state on disk lists replicated ones so too.
  Machine disk = m;
  disk.offload_disk = {"/nvme", 5e8};
  bool replicated = false;
  for (const Prediction& q : rank_layouts(w, disk, 8, OffloadLayouts::Only)) {
    EXPECT_TRUE(q.layout.offload) << flags_of(q.layout, w);
    replicated = replicated || q.layout.dp_replicate == 2;
  }
  EXPECT_TRUE(replicated);
  // On one node there is nothing to replicate.
  for (const Prediction& one : rank_layouts(w, round_machine(8), 8))
    EXPECT_EQ(one.layout.dp_replicate, 1);
}

TEST(CostModel, OptimizerStateOnDiskLeavesMemoryAndWaitsForTheDisk) {
  const Workload w = workload_of("gpt-small", 64, 8);
  Machine m = round_machine();
  m.adamw_seconds_per_parameter = 1e-9;
  m.offload_disk = {"/nvme", 5e8};
  Layout zero3;
  zero3.dp = 8;
  zero3.zero = 3;
  Layout disk = zero3;
  disk.offload = true;
  const Prediction in_memory = predict(w, m, zero3), on_disk = predict(w, m, disk);
  double P = -double(w.vocab * w.hidden);  // the tied embedding once
  for (int64_t u : w.unit_parameters)
    P += double(u);
  const double shard = P / 8, buffers = 4 * 32.0 * (1 << 20);
  EXPECT_NEAR(in_memory.model_state_bytes - on_disk.model_state_bytes, 8 * shard - buffers, 1);
  EXPECT_NEAR(on_disk.offload_s, 2 * 8 * shard / 5e8 - shard * 1e-9, 1e-9);
  EXPECT_DOUBLE_EQ(on_disk.compute_s, in_memory.compute_s);
  EXPECT_DOUBLE_EQ(in_memory.offload_s, 0);
  EXPECT_NEAR(on_disk.step_s(),
              on_disk.compute_s + on_disk.exposed_comm_s + on_disk.bubble_s + on_disk.offload_s,
              1e-12);
  // A step slower than its disk hides it.
  Machine slow = m;
  slow.adamw_seconds_per_parameter = 1e-6;
  EXPECT_DOUBLE_EQ(predict(w, slow, disk).offload_s, 0);
  // A shard smaller than a buffer holds buffers of its size.
  const Workload tiny = workload_of("gpt-debug", 32, 8);
  double tiny_P = -double(tiny.vocab * tiny.hidden);
  for (int64_t u : tiny.unit_parameters)
    tiny_P += double(u);
  EXPECT_NEAR(predict(tiny, m, zero3).model_state_bytes - predict(tiny, m, disk).model_state_bytes,
              8 * tiny_P / 8 - 4 * 4 * tiny_P / 8, 1);
  EXPECT_EQ(flags_of(disk, w, "/nvme"),
            "--model gpt-small --seq-len 64 --batch-size 1 --strategy zero3 "
            "--offload-optimizer nvme --offload-dir /nvme");
  // ZeRO-3's parameter shards there too: no master shard in memory, its 4 bytes a parameter
  // read and written beside the moments' 8.
  Layout params_too = disk;
  params_too.offload_params = true;
  const Prediction shards_on_disk = predict(w, m, params_too);
  EXPECT_NEAR(on_disk.model_state_bytes - shards_on_disk.model_state_bytes, 4 * shard, 1);
  EXPECT_NEAR(shards_on_disk.offload_s, 2 * 12 * shard / 5e8 - shard * 1e-9, 1e-9);
  EXPECT_EQ(flags_of(params_too, w),
            "--model gpt-small --seq-len 64 --batch-size 1 --strategy zero3 "
            "--offload-optimizer nvme --offload-params nvme");

  // Ranked: where the layout fits, no twin; where it does not, its twin beside it.
  const int world = 8;
  size_t layouts = 0, zero_layouts = 0, zero3_layouts = 0;
  for (const Layout& l : enumerate_layouts(w, world)) {
    ++layouts;
    zero_layouts += l.zero > 0;
    zero3_layouts += l.zero == 3;
  }
  auto offloaded = [](const std::vector<Prediction>& ranked) {
    size_t n = 0;
    for (const Prediction& p : ranked) {
      n += p.layout.offload;
      if (p.layout.offload) EXPECT_GT(p.layout.zero, 0);
      if (p.layout.offload_params) EXPECT_TRUE(p.layout.zero == 3 && p.layout.offload);
    }
    return n;
  };
  Machine roomy = m;
  roomy.memory_per_rank_bytes = 1e12;
  EXPECT_EQ(rank_layouts(w, roomy, world).size(), layouts);  // every layout fits
  Machine tight = m;
  tight.memory_per_rank_bytes = on_disk.peak_bytes + 1;
  const std::vector<Prediction> needed = rank_layouts(w, tight, world);
  EXPECT_GT(offloaded(needed), 0u);
  for (const Prediction& p : needed)
    if (p.layout.offload) {
      Layout less = p.layout;  // the optimizer's state alone on disk, or nothing
      if (less.offload_params) {
        less.offload_params = false;
      } else {
        less.offload = false;
      }
      EXPECT_FALSE(predict(w, tight, less).fits) << flags_of(p.layout, w);
    }
  // Where the state alone on disk does not fit either, the parameter shards go too.
  Machine tighter = m;
  tighter.memory_per_rank_bytes = shards_on_disk.peak_bytes + 1;
  size_t with_shards = 0;
  for (const Prediction& p : rank_layouts(w, tighter, world))
    with_shards += p.layout.offload_params;
  EXPECT_GT(with_shards, 0u);
  EXPECT_TRUE(needed.front().fits);
  EXPECT_EQ(offloaded(rank_layouts(w, tight, world, OffloadLayouts::None)), 0u);
  const std::vector<Prediction> only = rank_layouts(w, m, world, OffloadLayouts::Only);
  EXPECT_EQ(only.size(), zero_layouts + zero3_layouts);
  EXPECT_EQ(offloaded(only), zero_layouts + zero3_layouts);
  // Without the disk's rates, or on a GPU: no twin, and asking for them is an error.
  Machine no_disk = tight;
  no_disk.offload_disk = {};
  EXPECT_EQ(offloaded(rank_layouts(w, no_disk, world)), 0u);
  std::string e = testing::error_of<ConfigError>(
      [&] { rank_layouts(w, no_disk, world, OffloadLayouts::Only); });
  EXPECT_NE(e.find("calibrate --offload-dir DIR"), std::string::npos) << e;
  Machine gpu = tight;
  gpu.device = "cuda";
  EXPECT_EQ(offloaded(rank_layouts(w, gpu, world)), 0u);
  e = testing::error_of<ConfigError>([&] { rank_layouts(w, gpu, world, OffloadLayouts::Only); });
  EXPECT_NE(e.find("the plan has no rates for a GPU's offload"), std::string::npos) << e;
}

TEST(CostModel, EveryLayoutIsOneTheRunAccepts) {
  const Workload w = workload_of("gpt-debug", 32, 8);  // 4 heads, 2 blocks
  const std::vector<Layout> all = enumerate_layouts(w, 4);
  ASSERT_FALSE(all.empty());
  bool tp4 = false, cp2 = false, pp2 = false;
  for (const Layout& l : all) {
    EXPECT_EQ(l.dp * l.tp * l.pp * l.cp, 4);
    EXPECT_EQ(w.heads % l.tp, 0);
    EXPECT_EQ(w.global_batch % l.dp, 0);
    if (l.cp > 1) EXPECT_EQ(l.pp, 1);
    if (l.dp * l.cp == 1) EXPECT_EQ(l.zero, 0);  // nothing to shard
    if (l.pp > 1) EXPECT_EQ((w.global_batch / l.dp) % l.microbatches, 0);
    tp4 |= l.tp == 4;
    cp2 |= l.cp == 2;
    pp2 |= l.pp == 2;
  }
  EXPECT_TRUE(tp4 && cp2 && pp2);
  Layout l;
  l.dp = 2, l.tp = 2, l.zero = 3, l.activation_checkpointing = true;
  EXPECT_EQ(flags_of(l, w),
            "--model gpt-debug --seq-len 32 --batch-size 4 --strategy zero3 --tp 2 "
            "--activation-checkpointing 1");
  const std::vector<Prediction> ranked = rank_layouts(w, round_machine(), 4);
  ASSERT_EQ(ranked.size(), all.size());
  for (size_t i = 1; i < ranked.size(); ++i) {
    if (ranked[i].fits == ranked[i - 1].fits)
      EXPECT_LE(ranked[i - 1].step_s(), ranked[i].step_s());
    else
      EXPECT_TRUE(ranked[i - 1].fits);
  }
}

TEST(MachineFile, RoundTripsAndNamesWhatIsWrong) {
  const std::string dir = testing::scratch_dir("machine_file");
  Machine m = round_machine(4);
  m.inter_node[Collective::AllReduce] = {{8, 5e-5, 1e10}};
  m.inter_node_concurrent[Collective::AllReduce] = {{2, 5e-5, 2e9}};
  m.overlap["zero2"] = 0.7;
  m.matmul_by_rows["fp32"] = {{64, 5e8}, {1024, 1e9}};
  m.first_touch_seconds_per_byte = 1e-9;
  m.ring_attention = {1e-3, 2e-9, 0.25};
  m.conv_flops["fp32"] = 2e8;
  m.offload_disk = {"/nvme", 1e9};
  { std::ofstream(dir + "/m.json") << machine_json(m); }
  const Machine back = read_machine(dir + "/m.json");
  EXPECT_EQ(machine_json(back), machine_json(m));
  EXPECT_DOUBLE_EQ(back.flops("fp32", 64), 5e8);
  EXPECT_DOUBLE_EQ(back.first_touch_seconds_per_byte, 1e-9);
  EXPECT_DOUBLE_EQ(back.ring_attention.seconds_per_score, 2e-9);
  EXPECT_DOUBLE_EQ(back.convolution_flops("fp32"), 2e8);
  EXPECT_EQ(back.offload_disk.dir, "/nvme");
  EXPECT_DOUBLE_EQ(back.offload_disk.state_bytes_per_s, 1e9);
  EXPECT_DOUBLE_EQ(back.concurrent_seconds(Collective::AllReduce, 2, 2e9), 5e-5 * 2 + 1.0);
  auto error_for = [&](const std::string& text) {
    std::ofstream(dir + "/bad.json") << text;
    return testing::error_of<ConfigError>([&] { read_machine(dir + "/bad.json"); });
  };
  std::string e = error_for(R"({"matmul_flops": {"fp32": 1e9}, "intra_node": {}})");
  EXPECT_NE(e.find("memory_per_rank_bytes is missing"), std::string::npos) << e;
  e = error_for(R"({"memory_per_rank_bytes": 1e9, "matmul_flop": {}})");
  EXPECT_NE(e.find("matmul_flops"), std::string::npos) << e;
  e = error_for(R"({"memory_per_rank_bytes": 1e9, "matmul_flops": {"fp32": 1e9}, "intra_node": )"
                R"({"allreduce": [{"ranks": 2, "latency_s": 1e-5}]}})");
  EXPECT_NE(e.find("bus_bytes_per_s"), std::string::npos) << e;
  e = error_for(R"({"memory_per_rank_bytes": 1e9, "matmul_flops": {"fp32": 1e9}, )"
                R"("matmul_by_rows": {"fp32": [{"rows": 64}]}, "intra_node": {}})");
  EXPECT_NE(e.find("matmul_by_rows.fp32[0].flops"), std::string::npos) << e;
  e = error_for(R"({"memory_per_rank_bytes": 1e9, "matmul_flops": {"fp32": 1e9}, "intra_node": )"
                R"({}, "offload_disk": {"dir": "/nvme"}})");
  EXPECT_NE(e.find("offload_disk needs dir and state_bytes_per_s"), std::string::npos) << e;
  e = testing::error_of<ConfigError>([&] { read_machine(dir + "/none.json"); });
  EXPECT_NE(e.find("no such file"), std::string::npos) << e;
  // Rates outside what a machine can have: named with the value, not inf predictions.
  e = error_for(R"({"memory_per_rank_bytes": 1e9, "matmul_flops": {"fp32": 1e-300}, )"
                R"("intra_node": {}})");
  EXPECT_NE(e.find("matmul_flops.fp32"), std::string::npos) << e;
  EXPECT_NE(e.find("1e-300"), std::string::npos) << e;
  e = error_for(R"({"memory_per_rank_bytes": 1e9, "matmul_flops": {"fp32": 1e9}, "intra_node": )"
                R"({"allreduce": [{"ranks": 2, "bus_bytes_per_s": 1e14}]}})");
  EXPECT_NE(e.find("bus_bytes_per_s"), std::string::npos) << e;
  e = error_for(R"({"memory_per_rank_bytes": 0.5, "matmul_flops": {"fp32": 1e9}, )"
                R"("intra_node": {}})");
  EXPECT_NE(e.find("memory_per_rank_bytes"), std::string::npos) << e;
}

}  // namespace
}  // namespace dtorch::plan
