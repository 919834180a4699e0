// `dtorch train --dp-replicate` (Note [Hybrid sharding] in
// parallel/zero/sharded_model_reduce.cpp) on 4 ranks presented as 2 nodes of 2 (two launchers on
// 127.0.0.1): zero1, zero2 and zero3 with a replica a node end at the losses and weights of DDP on
// the same 4 ranks, and so do zero2 with --tp 2 and zero3 with --pp 2 on 2 nodes of 4; auto makes
// the nodes the replicas; the checkpoint the replicas wrote together holds every parameter once and
// consolidates to the model the run ended with, resumes as plain ZeRO at another world size and
// back, and under DDP; bf16, activation checkpointing, the optimizer's state on the host and fp16
// loss scaling compose with it. bench memory's counts of the bytes sent across nodes are the
// Note's.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dtorch/core/paths.h"
#include "dtorch/core/torch_compat.h"
#include "support/command.h"
#include "support/train_run.h"
#include "support/workers.h"

namespace dtorch {
namespace {

using testing::contains;
using testing::epochs_of;
using testing::model_file;

// The run's arguments without --nproc-per-node: the launchers give the ranks.
std::vector<std::string> under_launchers(std::vector<std::string> args) {
  for (size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == "--nproc-per-node") {
      args.erase(args.begin() + i, args.begin() + i + 2);
      break;
    }
  }
  return args;
}

// `args` on 2 nodes of `per_node` ranks; the two launchers' stdout and stderr, node 0's first.
struct Output {
  std::string out, err;
};
Output run_on_two_nodes(const std::string& name, const std::vector<std::string>& args,
                        int per_node = 2) {
  const int port = testing::free_port();
  std::vector<testing::Command> nodes;
  for (int node = 0; node < 2; ++node) {
    std::vector<std::string> launch = {"--nnodes",
                                       "2",
                                       "--node-rank",
                                       std::to_string(node),
                                       "--nproc-per-node",
                                       std::to_string(per_node),
                                       "--master-addr",
                                       "127.0.0.1",
                                       "--master-port",
                                       std::to_string(port),
                                       "--"};
    launch.insert(launch.end(), args.begin(), args.end());
    nodes.push_back(
        testing::start_launch(testing::scratch_dir(name + std::to_string(node)), launch));
  }
  Output all;
  for (const auto& node : nodes) {
    auto r = testing::finish_command(node, 300);
    EXPECT_EQ(r.exit_code(), 0) << name << "\n" << r.out << r.err;
    all.out += r.out;
    all.err += r.err;
  }
  return all;
}

TEST(TrainHybridSharding, ReplicaANodeTrainsAsDataParallelAndItsCheckpointIsWhole) {
  const std::string ref = testing::scratch_dir("hsdp_ref") + "/run";
  auto r = testing::run_command("hsdp_ref", testing::gpt_debug_train_args(ref, "ddp", 4), 300);
  ASSERT_EQ(r.exit_code(), 0) << r.err;

  std::string out;
  for (const char* strategy : {"zero1", "zero2", "zero3"}) {
    const std::string name = std::string("hsdp_") + strategy;
    out = testing::scratch_dir(name) + "/run";
    auto args = under_launchers(testing::gpt_debug_train_args(out, strategy, 4));
    args.insert(args.end(), {"--dp-replicate", strategy == std::string("zero3") ? "auto" : "2"});
    const std::string err = run_on_two_nodes(name, args).err;
    EXPECT_TRUE(contains(err, "mesh: dp 4 (2 replicas of 2)")) << err;
    EXPECT_TRUE(contains(err, "sharded over 2 ranks in each of 2 replicas")) << err;
    testing::expect_same_run(out, ref, name);
    testing::expect_every_rank_wrote_shards(out, 4);

    // Every element of the last checkpoint written once, by one replica or the other: the
    // consolidated model is the one the run ended with.
    const std::string merged = testing::scratch_dir(name + "_merged") + "/model.pt";
    auto c = testing::run_command(name + "_consolidate",
                                  {DTORCH_CLI, "checkpoint", "consolidate", out, merged}, 60);
    ASSERT_EQ(c.exit_code(), 0) << c.err;
    const auto ended = model_file(out + "/model.pt");
    for (const auto& [key, tensor] : model_file(merged)) {
      ASSERT_TRUE(ended.count(key)) << key;
      EXPECT_TRUE(torch::equal(tensor, ended.at(key))) << name << " " << key;
    }
  }

  // zero3's checkpoint resumes as plain zero2 on 2 ranks, one epoch more.
  auto more = testing::gpt_debug_train_args(out, "zero2", 2, 3);
  more.push_back("--resume");
  auto m = testing::run_command("hsdp_resume", more, 300);
  ASSERT_EQ(m.exit_code(), 0) << m.err;
  EXPECT_TRUE(contains(m.err, "resum")) << m.err;
  EXPECT_EQ(epochs_of(out).size(), 3u);
  // And back: plain zero2's checkpoint resumes under hybrid zero3 on 2 nodes of 2.
  auto back = under_launchers(testing::gpt_debug_train_args(out, "zero3", 4, 4));
  back.insert(back.end(), {"--dp-replicate", "2", "--resume"});
  EXPECT_TRUE(contains(run_on_two_nodes("hsdp_back", back).err, "resum"));
  EXPECT_EQ(epochs_of(out).size(), 4u);
}

// With tensor or pipeline parallelism on 2 nodes of 4: a replica a node of dp 2 x tp 2, or a
// stage a node (where auto would replicate nothing: Note [Hybrid sharding]).
TEST(TrainHybridSharding, ComposesWithTensorAndPipelineParallelism) {
  const std::string ref = testing::scratch_dir("hsdp_layouts_ref") + "/run";
  auto r =
      testing::run_command("hsdp_layouts_ref", testing::gpt_debug_train_args(ref, "ddp", 4), 300);
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  for (const auto& [strategy, more] :
       {std::pair<std::string, std::vector<std::string>>{"zero2", {"--tp", "2"}},
        {"zero3", {"--pp", "2"}}}) {
    const std::string name = "hsdp_" + strategy + more.front().substr(2);
    const std::string run = testing::scratch_dir(name) + "/run";
    auto args = under_launchers(testing::gpt_debug_train_args(run, strategy, 8));
    args.insert(args.end(), more.begin(), more.end());
    args.insert(args.end(), {"--dp-replicate", "2"});
    const std::string err = run_on_two_nodes(name, args, 4).err;
    EXPECT_TRUE(contains(err, more.front() == "--tp" ? "mesh: dp 4 (2 replicas of 2) x tp 2"
                                                     : "mesh: pp 2 x dp 4 (2 replicas of 2)"))
        << err;
    testing::expect_same_run(run, ref, name);
  }
}

// With what a step adds around the reduction: bf16 autocast, activation checkpointing and the
// optimizer's state on the host under zero3, fp16 with loss scaling under zero2 (LibTorch 2.x:
// 1.13's CPU autocast has no float16), from a scale of 2^20 at which the first 3 of 8 steps
// overflow and the rest train. Each ends as plain ZeRO with the same flags on the same 4 ranks
// does, and skips the same steps (every replica sees the same averaged shards, so all agree on an
// overflow); the zero3 run's checkpoint resumes under DDP.
TEST(TrainHybridSharding, ComposesWithMixedPrecisionCheckpointingAndOffload) {
  struct Variant {
    std::string name, strategy;
    std::vector<std::string> flags;
  };
  std::vector<Variant> variants = {
      {"bf16_ac_host",
       "zero3",
       {"--precision", "bf16", "--activation-checkpointing", "--offload-optimizer", "cpu"}}};
  if (compat::kTorch2)
    variants.push_back(
        {"fp16",
         "zero2",
         {"--precision", "fp16", "--initial-scale-power", "20", "--hysteresis", "1"}});
  for (const Variant& v : variants) {
    const std::string name = "hsdp_" + v.name;
    const std::string ref = testing::scratch_dir(name + "_ref") + "/run";
    auto r = testing::run_command(
        name + "_ref", testing::with(testing::gpt_debug_train_args(ref, v.strategy, 4), v.flags),
        300);
    ASSERT_EQ(r.exit_code(), 0) << r.err;
    const std::string out = testing::scratch_dir(name) + "/run";
    auto args = under_launchers(testing::gpt_debug_train_args(out, v.strategy, 4));
    args.insert(args.end(), v.flags.begin(), v.flags.end());
    args.insert(args.end(), {"--dp-replicate", "2"});
    EXPECT_TRUE(contains(run_on_two_nodes(name, args).err, "mesh: dp 4 (2 replicas of 2)"));
    const auto got = epochs_of(out), want = epochs_of(ref);
    ASSERT_EQ(got.size(), want.size()) << name;
    for (size_t e = 0; e < got.size(); ++e) {
      // Low precision rounds the replicas' two-stage average apart from one reduce-scatter's.
      for (const char* key : {"train_loss", "test_loss"})
        EXPECT_NEAR(got[e][key].get<double>(), want[e][key].get<double>(), 2e-3)
            << name << " epoch " << e << " " << key;
      for (const char* key : {"skipped_steps", "loss_scale"})
        EXPECT_EQ(got[e].value(key, nlohmann::json()), want[e].value(key, nlohmann::json()))
            << name << " epoch " << e << " " << key;
    }
    if (v.name == "fp16") {  // some steps skipped, some taken
      EXPECT_GT(got.back()["skipped_steps"].get<int64_t>(), 0) << got.back().dump();
      EXPECT_LT(got.back()["skipped_steps"].get<int64_t>(), got.back()["step"].get<int64_t>())
          << got.back().dump();
    }
    if (v.strategy == "zero3") {
      auto ddp = testing::with(testing::gpt_debug_train_args(out, "ddp", 2, 3),
                               {"--precision", "bf16", "--resume"});
      auto d = testing::run_command(name + "_ddp", ddp, 300);
      ASSERT_EQ(d.exit_code(), 0) << d.err;
      EXPECT_TRUE(contains(d.err, "resum")) << d.err;
      EXPECT_EQ(epochs_of(out).size(), 3u);
    }
  }
}

// Note [Hybrid sharding]'s bytes across nodes, counted as the rings send them (Note [Traffic
// across nodes]): gpt-debug under zero3 on 2 nodes of 2. Plain, the ranks that end a node send
// everything across; hybrid, every rank sends only its gradient shard's allreduce across, 2
// (R-1)/R of the shard's bytes, and the run's estimate of plain ZeRO's total is what plain
// ZeRO sent.
TEST(TrainHybridSharding, OnlyTheGradientShardsAllreduceCrossesNodes) {
  std::map<int, std::vector<nlohmann::json>> rows;  // by --dp-replicate, in rank order
  std::string said;
  for (int replicas : {1, 2}) {
    const Output o = run_on_two_nodes(
        "hsdp_bytes" + std::to_string(replicas),
        {DTORCH_CLI, "bench", "memory", "--model", "gpt-debug", "--strategy", "zero3",
         "--dp-replicate", std::to_string(replicas), "--warmup-steps", "1", "--steps", "2"});
    std::istringstream in(o.out);
    for (std::string line; std::getline(in, line);) {
      const size_t brace = line.find('{');  // after the launcher's "[host n0 r0] "
      if (brace != std::string::npos)
        rows[replicas].push_back(nlohmann::json::parse(line.substr(brace)));
    }
    std::sort(rows[replicas].begin(), rows[replicas].end(),
              [](const auto& a, const auto& b) { return a["rank"] < b["rank"]; });
    ASSERT_EQ(rows[replicas].size(), 4u) << o.out;
    if (replicas == 2) said = o.err;
  }
  int64_t plain_across = 0, hybrid_across = 0;
  for (int r = 0; r < 4; ++r) {
    const auto& plain = rows[1][r]["bytes_sent_per_step"];
    plain_across += plain["cross_node"].get<int64_t>();
    // Ranks 1 and 3 end a node: their ring successors are on the other one.
    EXPECT_EQ(plain["cross_node"], r % 2 == 1 ? plain["total"] : nlohmann::json(0)) << r;
    const auto& row = rows[2][r];
    const auto& sent = row["bytes_sent_per_step"];
    const auto& replica = row["replicate_bytes_sent_per_step"];
    hybrid_across += sent["cross_node"].get<int64_t>();
    // 2 (R-1)/R x the fp32 gradient shard's bytes, all through the replicate group.
    EXPECT_EQ(sent["cross_node"], row["grad_bytes"]) << row.dump();
    EXPECT_EQ(replica["cross_node"], replica["total"]) << row.dump();
    EXPECT_EQ(replica["allreduce"], replica["total"]) << row.dump();
    EXPECT_EQ(sent["cross_node"], replica["cross_node"]) << row.dump();
    EXPECT_GT(sent["within_node"].get<int64_t>(), 0) << row.dump();
  }
  EXPECT_LT(hybrid_across, plain_across);
  EXPECT_EQ(rows[2][0]["job_cross_node_bytes_per_step"].get<double>(), hybrid_across);
  EXPECT_EQ(rows[2][0]["plain_zero_job_cross_node_bytes_per_step"].get<double>(), plain_across);
  EXPECT_TRUE(contains(said, "hybrid sharding: " + std::to_string(hybrid_across) +
                                 " bytes a step cross nodes in the job; plain ZeRO over its 4 "
                                 "ranks would send " +
                                 std::to_string(plain_across)))
      << said;
}

}  // namespace
}  // namespace dtorch
