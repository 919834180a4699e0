// `dtorch train --activation-checkpointing` under every strategy and layout: zero3 (whose
// recomputation runs on parameters its pre-backward gather brought back), zero1 every second
// block, ddp with tensor parallelism (the recomputation repeats the forward collectives) and
// under a pipeline give the loss curve and weights of the 2-rank DDP run without it; a model
// without blocks is refused by name.
#include <gtest/gtest.h>

#include "support/command.h"
#include "support/train_run.h"
#include "support/workers.h"

namespace dtorch {
namespace {

using testing::with;

TEST(TrainActivationCheckpointing, EveryStrategyAndLayoutMatchesTheRunWithoutIt) {
  const std::string base = testing::scratch_dir("ac_train");
  auto r = testing::run_command("ac_ref", testing::gpt_debug_train_args(base + "/ref", "ddp", 2, 1),
                                300);
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  struct Case {
    std::string name, strategy;
    int nproc;
    std::vector<std::string> flags;
  };
  for (const Case& c : std::vector<Case>{
           {"zero3", "zero3", 2, {"--activation-checkpointing"}},
           {"zero1_every2", "zero1", 2, {"--activation-checkpointing", "2"}},
           {"ddp_tp2", "ddp", 4, {"--tp", "2", "--activation-checkpointing"}},
           {"zero2_pp2_1f1b", "zero2", 4, {"--pp", "2", "--activation-checkpointing"}},
           {"ddp_pp2_zb",
            "ddp",
            4,
            {"--pp", "2", "--schedule", "zb", "--activation-checkpointing"}},
       }) {
    const std::string out = base + "/" + c.name;
    r = testing::run_command(
        "ac_" + c.name, with(testing::gpt_debug_train_args(out, c.strategy, c.nproc, 1), c.flags),
        300);
    ASSERT_EQ(r.exit_code(), 0) << c.name << "\n" << r.err;
    // gpt-debug has 2 blocks; under --pp 2 rank 0's stage holds one of them.
    const std::string recomputed = c.name == "zero1_every2"                  ? "1 of 2 block(s)"
                                   : c.name.find("pp2") != std::string::npos ? "1 of 1 block(s)"
                                                                             : "2 of 2 block(s)";
    EXPECT_TRUE(testing::contains(r.err, "activation checkpointing: " + recomputed)) << r.err;
    testing::expect_same_run(out, base + "/ref", c.name);
  }
  r = testing::run_command(
      "ac_mnist",
      {DTORCH_CLI, "train", "--model", "mnist-cnn", "--activation-checkpointing", "--out",
       base + "/m", "--epochs", "1", "--progress", "off"},
      60);
  EXPECT_NE(r.exit_code(), 0);
  EXPECT_TRUE(testing::contains(r.err,
                                "--activation-checkpointing: mnist-cnn has no repeating "
                                "blocks"))
      << r.err;
  r = testing::run_command("ac_negative",
                           with(testing::gpt_debug_train_args(base + "/n", "ddp", 1, 1),
                                {"--activation-checkpointing=-1"}),
                           60);
  EXPECT_NE(r.exit_code(), 0);
  EXPECT_TRUE(testing::contains(r.err, "K >= 1")) << r.err;
}

}  // namespace
}  // namespace dtorch
