// `dtorch train --strategy zero3` composed with tensor and pipeline parallelism (FSDP + TP,
// FSDP + PP, and all three; Note [ZeRO-3 under a pipeline]): after five AdamW steps every
// parameter and the evaluation's loss equal the one-process run's within 1e-5, though the data
// ranks evaluate different numbers of batches, with the pipeline's units gathered once
// per step and with --reshard-after-microbatch; a ZeRO-3 pipeline checkpoint resumes at other
// layouts as ZeRO-1/2's do; the flag is refused where it cannot work.
#include <gtest/gtest.h>

#include <algorithm>

#include "dtorch/core/error.h"
#include "support/command.h"
#include "support/train_run.h"
#include "support/workers.h"

namespace dtorch {
namespace {

using testing::model_file;
using testing::with;

// Five AdamW steps of gpt-debug on a global batch of 16 samples, whatever the layout, then an
// evaluation of 33 samples: at dp 2 one rank evaluates two batches of 16 and the other one,
// while ZeRO-3 gathers each unit in every forward.
std::vector<std::string> five_steps(const std::string& out, const std::string& strategy,
                                    int nproc) {
  auto a = testing::gpt_debug_train_args(out, strategy, nproc, 1);
  auto at = [&](const char* flag) { return std::find(a.begin(), a.end(), flag) + 1; };
  *at("--train-samples") = "80";
  *at("--test-samples") = "33";
  a.erase(at("--batch-size") - 1, at("--batch-size") + 1);
  return with(a, {"--global-batch-size", "16"});
}

TEST(TrainZero3Layouts, FiveAdamwStepsEqualOneProcess) {
  const std::string base = testing::scratch_dir("zero3_layouts");
  auto r = testing::run_command("zero3_one", five_steps(base + "/one", "ddp", 1), 300);
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  const auto want = model_file(base + "/one/model.pt");
  const auto want_epochs = testing::epochs_of(base + "/one");
  ASSERT_EQ(want_epochs.size(), 1u);
  struct Case {
    std::string name;
    int nproc;
    std::vector<std::string> flags;
    std::string mesh;
  };
  for (const Case& c : std::vector<Case>{
           {"tp2_dp2", 4, {"--tp", "2"}, "mesh: dp 2 x tp 2"},
           {"pp2_dp2", 4, {"--pp", "2"}, "mesh: pp 2 x dp 2"},
           {"pp2_dp2_resharded", 4, {"--pp", "2", "--reshard-after-microbatch"}, "pp 2 x dp 2"},
           {"pp2_tp2_dp2", 8, {"--pp", "2", "--tp", "2"}, "mesh: pp 2 x dp 2 x tp 2"}}) {
    const std::string out = base + "/" + c.name;
    r = testing::run_command("zero3_" + c.name, with(five_steps(out, "zero3", c.nproc), c.flags),
                             600);
    ASSERT_EQ(r.exit_code(), 0) << c.name << "\n" << r.err;
    EXPECT_TRUE(testing::contains(r.err, c.mesh)) << r.err;
    EXPECT_TRUE(testing::contains(r.err, "strategy: zero3")) << r.err;
    const auto epochs = testing::epochs_of(out);
    ASSERT_EQ(epochs.size(), 1u) << c.name;
    EXPECT_NEAR(epochs[0]["test_loss"].get<double>(), want_epochs[0]["test_loss"].get<double>(),
                1e-5)
        << c.name << ": the evaluation counts each sample once";
    auto got = model_file(out + "/model.pt");
    ASSERT_EQ(got.size(), want.size()) << c.name;
    for (const auto& [key, t] : got) {
      ASSERT_TRUE(want.count(key)) << c.name << " " << key;
      ASSERT_EQ(t.sizes(), want.at(key).sizes()) << c.name << " " << key;
      EXPECT_LE((t - want.at(key)).abs().max().item<double>(), 1e-5) << c.name << " " << key;
    }
    // The checkpoint holds ZeRO's shards per stage and tp index; consolidate joins them into
    // the model the run wrote.
    auto k =
        testing::run_command("zero3_consolidate_" + c.name,
                             {DTORCH_CLI, "checkpoint", "consolidate", out, out + "/full.pt"}, 60);
    ASSERT_EQ(k.exit_code(), 0) << k.err;
    for (const auto& [key, t] : model_file(out + "/full.pt"))
      EXPECT_TRUE(t.equal(got[key])) << c.name << " " << key;
  }
}

// One epoch at pp 2 x dp 2 under zero3, then the second at dp 2 without a pipeline: the run
// that was never stopped.
TEST(TrainZero3Layouts, PipelineCheckpointResumesWithoutAPipeline) {
  const std::string base = testing::scratch_dir("zero3_pp_resume");
  const std::vector<std::string> pp2 = {"--pp", "2"};
  auto whole = testing::gpt_debug_train_args(base + "/whole", "zero3", 4);
  auto r = testing::run_command("zero3_pp_whole", with(whole, pp2), 300);
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  auto first = testing::gpt_debug_train_args(base + "/split", "zero3", 4, 1);
  r = testing::run_command("zero3_pp_first", with(first, pp2), 300);
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  auto then = testing::gpt_debug_train_args(base + "/split", "zero3", 2);
  r = testing::run_command("zero3_pp_then", with(then, {"--resume"}), 300);
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_TRUE(testing::contains(r.err, "resuming from")) << r.err;
  testing::expect_same_run(base + "/split", base + "/whole", "zero3 at pp 2, resumed at pp 1");
}

TEST(TrainZero3Layouts, ReshardAfterMicrobatchNeedsZero3AndAWholeBackward) {
  const std::string base = testing::scratch_dir("zero3_bad");
  const std::vector<std::string> flag = {"--reshard-after-microbatch"};
  auto r = testing::run_command(
      "zero3_bad_zero2",
      with(testing::gpt_debug_train_args(base + "/a", "zero2", 2, 1), with(flag, {"--pp", "2"})),
      60);
  EXPECT_NE(r.exit_code(), 0);
  EXPECT_TRUE(testing::contains(r.err,
                                "it needs --strategy zero3 and --pp 2 or more (got "
                                "--strategy zero2, --pp 2)"))
      << r.err;
  r = testing::run_command("zero3_bad_zb",
                           with(testing::gpt_debug_train_args(base + "/b", "zero3", 2, 1),
                                with(flag, {"--pp", "2", "--schedule", "zb"})),
                           60);
  EXPECT_NE(r.exit_code(), 0);
  EXPECT_TRUE(testing::contains(r.err, "--reshard-after-microbatch with --schedule zb")) << r.err;
  EXPECT_TRUE(testing::contains(r.err, "use --schedule 1f1b or gpipe")) << r.err;
}

}  // namespace
}  // namespace dtorch
