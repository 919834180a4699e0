// `dtorch train --pp`: pp 4 on 4 ranks and pp 2 x dp 2 under ddp, zero1 and zero2, every
// schedule (interleaved: two stages per rank), and 3-D pp 2 x tp 2 (x dp 2 on 8 ranks), give
// the loss curve and final weights of the same job without a pipeline (one process, or 2
// data-parallel ranks); the final model file and `checkpoint consolidate` are whole. A DDP
// checkpoint written at pp 2 x dp 2, as one file per stage or shared by the dp ranks, resumes
// at pp 1, at pp 4 and interleaved with identical parameters, an interleaved one at pp 1 (Note
// [Pipeline checkpoints]); ZeRO's stage shards at pp 2 x dp 2 resume at pp 1 (as another ZeRO
// stage, and as DDP), at pp 4 and interleaved (Note [Resharding by name]).
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "dtorch/checkpoint/state_dict.h"
#include "dtorch/core/paths.h"
#include "support/command.h"
#include "support/train_run.h"
#include "support/workers.h"

namespace dtorch {
namespace {

using testing::expect_same_run;
using testing::model_file;
using testing::with;

std::vector<std::string> pipeline_train_args(const std::string& out, const std::string& strategy,
                                             int nproc, int epochs = 2) {
  // Clipping: across the stages under a pipeline, of ZeRO's gradient shards too.
  auto a = testing::gpt_debug_train_args(out, strategy, nproc, epochs);
  a.insert(a.end(), {"--clip-grad-norm", "1.0"});
  return a;
}

TEST(TrainPipeline, StagesMatchTheRunWithoutAPipeline) {
  const std::string base = testing::scratch_dir("pp_train");
  auto r = testing::run_command("pp_ref1", pipeline_train_args(base + "/ref1", "ddp", 1), 300);
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  r = testing::run_command("pp_ref2", pipeline_train_args(base + "/ref2", "ddp", 2), 300);
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  // pp 4: one unit per stage (embedding, two blocks, head), clipping across all four.
  r = testing::run_command(
      "pp4",
      with(pipeline_train_args(base + "/pp4", "ddp", 4), {"--pp", "4", "--schedule", "1f1b"}), 300);
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_TRUE(testing::contains(r.err, "mesh: pp 4")) << r.err;
  EXPECT_TRUE(testing::contains(r.err, "stage 3: head")) << r.err;
  expect_same_run(base + "/pp4", base + "/ref1", "pp4");
  for (const auto& [strategy, schedule] :
       std::vector<std::pair<std::string, std::string>>{{"ddp", "gpipe"},
                                                        {"zero1", "zb"},
                                                        {"zero2", "1f1b"},
                                                        {"ddp", "interleaved"},
                                                        {"zero2", "interleaved"}}) {
    const std::string name = strategy + "_" + schedule, out = base + "/" + name;
    r = testing::run_command(
        name, with(pipeline_train_args(out, strategy, 4), {"--pp", "2", "--schedule", schedule}),
        300);
    ASSERT_EQ(r.exit_code(), 0) << name << "\n" << r.err;
    EXPECT_TRUE(testing::contains(r.err, "mesh: pp 2 x dp 2")) << r.err;
    expect_same_run(out, base + "/ref2", name);
    // Interleaved: 4 stages on 2 ranks; ZeRO keeps each rank's stages in one folder.
    const int stages = schedule == "interleaved" ? 4 : 2;
    const int folders = schedule == "interleaved" && strategy == "ddp" ? 4 : 2;
    for (int s = 0; s < folders; ++s) {
      EXPECT_TRUE(paths::exists(out + "/pp" + std::to_string(s) + "-of-" + std::to_string(stages)))
          << name << " stage " << s;
    }
    auto k =
        testing::run_command("consolidate_" + name,
                             {DTORCH_CLI, "checkpoint", "consolidate", out, out + "/full.pt"}, 60);
    ASSERT_EQ(k.exit_code(), 0) << k.err;
    auto full = model_file(out + "/full.pt"), final = model_file(out + "/model.pt");
    ASSERT_EQ(full.size(), final.size()) << name;
    for (const auto& [key, t] : full)
      EXPECT_TRUE(t.equal(final[key])) << name << " " << key;
  }
}

// 3-D: pipeline stages split by tensor parallelism, data parallel over the rest.
TEST(TrainPipeline, PipelineTimesTensorTimesDataMatchesDataParallelOnly) {
  const std::string base = testing::scratch_dir("pp_3d");
  auto unclipped = [](std::vector<std::string> a) {
    a.back() = "0";
    return a;
  };
  // dp 1 under ddp and under zero2 (its shards per stage and tp index), and interleaved
  // (two stages per rank) under ddp with sequence parallelism and under zero1; dp 2 under ddp.
  struct Case {
    int dp;
    std::string strategy;
    std::vector<std::string> flags;
  };
  const std::vector<std::string> interleaved = {"--schedule", "interleaved"};
  for (const auto& [dp, strategy, flags] :
       std::vector<Case>{{1, "ddp", {}},
                         {1, "zero2", {}},
                         {1, "ddp", with(interleaved, {"--sequence-parallel"})},
                         {1, "zero1", interleaved},
                         {2, "ddp", {"--checkpoint-layout", "sharded"}}}) {
    const std::string ref = base + "/ref" + std::to_string(dp);
    if (!paths::exists(ref + "/model.pt")) {
      auto r =
          testing::run_command("pp3d_ref", unclipped(pipeline_train_args(ref, "ddp", dp)), 300);
      ASSERT_EQ(r.exit_code(), 0) << r.err;
    }
    const bool shared = strategy == "ddp" && dp == 2;  // dp rank 0's tp ranks share saves
    const std::string out = base + "/pp2tp2dp" + std::to_string(dp) + strategy +
                            (flags.empty() || shared ? "" : "_interleaved");
    auto r = testing::run_command("pp3d",
                                  with(with(unclipped(pipeline_train_args(out, strategy, 4 * dp)),
                                            {"--pp", "2", "--tp", "2"}),
                                       flags),
                                  600);
    ASSERT_EQ(r.exit_code(), 0) << r.err;
    EXPECT_TRUE(
        testing::contains(r.err, dp == 1 ? "mesh: pp 2 x tp 2" : "mesh: pp 2 x dp 2 x tp 2"))
        << r.err;
    expect_same_run(out, ref,
                    "pp 2 x tp 2 x dp " + std::to_string(dp) + " " + strategy +
                        (flags.empty() || shared ? "" : " interleaved"));
    const std::string last_folder = flags.empty() || shared ? "/pp1-of-2" : "/pp1-of-4";
    if (strategy != "ddp") {
      EXPECT_TRUE(paths::exists(out + last_folder + "/tp1-of-2")) << out;
      EXPECT_TRUE(paths::exists(out + last_folder + "/tensor_parallel.json")) << out;
    }
    if (shared) testing::expect_every_rank_wrote_shards(out + last_folder, 2);  // its 2 tp ranks
    // DDP's stage checkpoints hold whole (unsplit) stages, as one file or shared, ZeRO's their
    // shards per tp index: consolidate gives the final model from each.
    auto k = testing::run_command(
        "pp3d_consolidate", {DTORCH_CLI, "checkpoint", "consolidate", out, out + "/full.pt"}, 60);
    ASSERT_EQ(k.exit_code(), 0) << k.err;
    auto full = model_file(out + "/full.pt"), final = model_file(out + "/model.pt");
    ASSERT_EQ(full.size(), final.size());
    for (const auto& [key, t] : full)
      EXPECT_TRUE(t.equal(final[key])) << key;
  }
}

// Saves `saved_as` at pp 2 x dp 2 after one epoch of two, then resumes it as `resumed_as`:
// at pp 1 x dp 2 (the same data order) for the second epoch, which must be the uninterrupted
// run's; at pp 4 and interleaved (stages 0 and 2 on one rank, 1 and 3 on the other) with
// nothing left to train, which must write the loaded weights back unchanged. Returns those
// weights; leaves a copy of the saved run in base/same.
std::map<std::string, torch::Tensor> expect_resumes_at_other_layouts(
    const std::string& base, const std::string& saved_as, const std::string& resumed_as,
    const std::vector<std::string>& save_flags = {}) {
  const std::vector<std::string> pp2 = with({"--pp", "2"}, save_flags);
  auto r = testing::run_command("pp_whole",
                                with(pipeline_train_args(base + "/whole", saved_as, 4), pp2), 300);
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  r = testing::run_command("pp_first",
                           with(pipeline_train_args(base + "/split", saved_as, 4, 1), pp2), 300);
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  for (const char* copy : {"/pp4", "/interleaved", "/same"})
    paths::copy_tree(base + "/split", base + copy);
  auto after_one = model_file(base + "/split/model.pt");
  const std::string name = saved_as + " at pp 2 resumed as " + resumed_as;
  r = testing::run_command("pp_resume_pp1",
                           with(pipeline_train_args(base + "/split", resumed_as, 2), {"--resume"}),
                           300);
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_TRUE(testing::contains(r.err, "resuming from")) << r.err;
  expect_same_run(base + "/split", base + "/whole", name + " at pp 1");
  EXPECT_FALSE(paths::exists(base + "/split/pipeline.json"));  // its stage folders are older now
  const std::vector<std::string> interleaved = {"--pp",           "2", "--schedule", "interleaved",
                                                "--microbatches", "4", "--resume"};
  for (const auto& [dir, flags] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"/pp4", {"--pp", "4", "--resume"}}, {"/interleaved", interleaved}}) {
    r = testing::run_command("pp_resume" + dir.substr(1),
                             with(pipeline_train_args(base + dir, resumed_as, 4, 1), flags), 300);
    EXPECT_EQ(r.exit_code(), 0) << r.err;
    for (const auto& [k, t] : model_file(base + dir + "/model.pt"))
      EXPECT_TRUE(t.equal(after_one[k])) << name << dir << " " << k;
  }
  return after_one;
}

TEST(TrainPipeline, DdpCheckpointAtPp2Dp2ResumesAtPp1Pp4AndInterleaved) {
  const std::string base = testing::scratch_dir("pp_any_layout");
  auto after_one = expect_resumes_at_other_layouts(base, "ddp", "ddp");
  // An interleaved run's stage checkpoints resume at pp 1: its second epoch is the
  // uninterrupted run's.
  const std::vector<std::string> il = {"--pp", "2", "--schedule", "interleaved"};
  auto r = testing::run_command("pp_il_first",
                                with(pipeline_train_args(base + "/il", "ddp", 4, 1), il), 300);
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  r = testing::run_command("pp_il_resume_pp1",
                           with(pipeline_train_args(base + "/il", "ddp", 2), {"--resume"}), 300);
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_TRUE(testing::contains(r.err, "resuming from")) << r.err;
  expect_same_run(base + "/il", base + "/whole", "interleaved, resumed at pp 1");
  // And at pp 1 on one process, likewise.
  r = testing::run_command(
      "pp_resume_one", with(pipeline_train_args(base + "/same", "ddp", 1, 1), {"--resume"}), 300);
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  for (const auto& [k, t] : model_file(base + "/same/model.pt"))
    EXPECT_TRUE(t.equal(after_one[k])) << k;
}

// A run stopped while its stages saved (`make faults` killed a rank inside a pp 2 save) leaves
// one stage folder an epoch ahead of the other: every rank resumes from the newest epoch all
// the stages hold, and the run ends as the uninterrupted one. Stopped during its first save, it
// starts afresh.
TEST(TrainPipeline, AStopWhileTheStagesSaveResumesFromTheEpochEveryStageHolds) {
  const std::string base = testing::scratch_dir("pp_stopped_saving");
  const std::vector<std::string> pp2 = {"--pp", "2", "--schedule", "1f1b"};
  auto r = testing::run_command("pp_stopped_whole",
                                with(pipeline_train_args(base + "/whole", "ddp", 2), pp2), 300);
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  paths::copy_tree(base + "/whole", base + "/ahead");
  paths::remove(base + "/ahead/pp0-of-2/checkpoint-000002.dtc");
  auto resume = with(with(pipeline_train_args(base + "/ahead", "ddp", 2), pp2), {"--resume"});
  r = testing::run_command("pp_stopped_ahead", resume, 300);
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_TRUE(testing::contains(r.err, "(1 epoch(s) done)")) << r.err;
  auto whole = model_file(base + "/whole/model.pt");
  for (const auto& [k, t] : model_file(base + "/ahead/model.pt"))
    EXPECT_TRUE(t.equal(whole[k])) << k;

  r = testing::run_command("pp_stopped_first",
                           with(pipeline_train_args(base + "/first", "ddp", 2, 1), pp2), 300);
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  auto first = model_file(base + "/first/model.pt");
  paths::remove(base + "/first/pp1-of-2/checkpoint-000001.dtc");
  r = testing::run_command(
      "pp_stopped_first_resume",
      with(with(pipeline_train_args(base + "/first", "ddp", 2, 1), pp2), {"--resume"}), 300);
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_TRUE(testing::contains(r.err,
                                "the run stopped during its first save; starting from "
                                "scratch"))
      << r.err;
  for (const auto& [k, t] : model_file(base + "/first/model.pt"))
    EXPECT_TRUE(t.equal(first[k])) << k;
}

// DDP's stage checkpoints that the dp ranks share (Note [Saving replicated state]) are shards in
// ZeRO's layout: each of a stage's two dp ranks wrote some of its tensors, and they resume at
// pp 1, pp 4 and interleaved as the one-file stage checkpoints do.
TEST(TrainPipeline, DdpSharedStageCheckpointsResumeAtPp1Pp4AndInterleaved) {
  const std::string base = testing::scratch_dir("pp_shared_any_layout");
  expect_resumes_at_other_layouts(base, "ddp", "ddp", {"--checkpoint-layout", "sharded"});
  testing::expect_every_rank_wrote_shards(base + "/whole/pp1-of-2", 2);
}

// ZeRO-1's stage shards resume as ZeRO-2 (other units, other stages): read by parameter name
// with Adam's moments (Note [Resharding by name]).
TEST(TrainPipeline, ZeroCheckpointAtPp2Dp2ResumesAtPp1Pp4AndInterleaved) {
  expect_resumes_at_other_layouts(testing::scratch_dir("pp_zero_any_layout"), "zero1", "zero2");
}

// A run stopped before its first save leaves config.json and metrics.jsonl in --out: --resume
// (and --max-restarts, which resumes) starts it afresh, as without a pipeline.
TEST(TrainPipeline, ResumingARunStoppedBeforeItsFirstSaveStartsAfresh) {
  const std::string out = testing::scratch_dir("pp_resume_early");
  std::ofstream(out + "/metrics.jsonl") << "{\"kind\": \"step\", \"step\": 1}\n";
  auto r = testing::run_command(
      "pp_resume_early", with(pipeline_train_args(out, "ddp", 2, 1), {"--pp", "2", "--resume"}),
      300);
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_TRUE(paths::exists(out + "/pipeline.json")) << r.err;
}

TEST(TrainPipeline, BadPipelineFlagsAndOtherLayoutsAreNamed) {
  const std::string base = testing::scratch_dir("pp_bad");
  auto zero = with(pipeline_train_args(base + "/z", "zero1", 4, 1), {"--pp", "2"});
  auto r = testing::run_command("pp_zero1", zero, 300);
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  // DDP reads ZeRO's stage shards by name, as it reads its own shared ones.
  r = testing::run_command(
      "pp_zero1_as_ddp",
      with(pipeline_train_args(base + "/z", "ddp", 4, 2), {"--pp", "2", "--resume"}), 120);
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_TRUE(testing::contains(r.err, "resuming from")) << r.err;
  // ZeRO cannot read DDP's whole stage checkpoints: named, not a silent fresh start.
  r = testing::run_command("pp_ddp",
                           with(pipeline_train_args(base + "/d", "ddp", 4, 1), {"--pp", "2"}), 300);
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  r = testing::run_command(
      "pp_ddp_as_zero1",
      with(pipeline_train_args(base + "/d", "zero1", 4, 2), {"--pp", "2", "--resume"}), 120);
  EXPECT_NE(r.exit_code(), 0);
  EXPECT_TRUE(testing::contains(r.err, "holds ddp's checkpoints")) << r.err;
  r = testing::run_command("pp_split",
                           with(pipeline_train_args(base + "/x", "ddp", 2, 1),
                                {"--pp", "2", "--pp-split", "transformer.h.0,head"}),
                           60);
  EXPECT_NE(r.exit_code(), 0);
  EXPECT_TRUE(testing::contains(r.err, "give 1 cut(s)")) << r.err;
  r = testing::run_command("pp_mnist",
                           {DTORCH_CLI, "train", "--model", "mnist-cnn", "--pp", "2",
                            "--nproc-per-node", "2", "--out", base + "/m", "--epochs", "1"},
                           60);
  EXPECT_NE(r.exit_code(), 0);
  EXPECT_TRUE(testing::contains(r.err, "1 pipeline unit")) << r.err;
}

}  // namespace
}  // namespace dtorch
