// fp16 training's loss scaling inside the strategies (Note [Loss scaling]), on the CPU with
// injected infinities: an overflow on one rank skips the step on every rank, and the run then
// equals a run that never took that step; `dtorch train --precision fp16` records its scale,
// halves it at each overflow with --hysteresis 1 and does not advance the learning-rate schedule
// on a skipped step. LibTorch 1.13's CPU autocast has no float16: there the flag is refused.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "dtorch/checkpoint/state_dict.h"
#include "dtorch/core/error.h"
#include "dtorch/core/torch_compat.h"
#include "dtorch/models/registry.h"
#include "dtorch/parallel/autocast.h"
#include "dtorch/train/config/lr_schedule.h"
#include "dtorch/train/loss.h"
#include "dtorch/train/strategy/strategy.h"
#include "support/command.h"
#include "support/train_run.h"
#include "support/workers.h"

namespace dtorch::train {
namespace {

constexpr int kSkippedStep = 2;

// args: DIR STRATEGY MODE. MODE inject: rank 1's gradient overflows at step kSkippedStep (for
// ddp an inf put into its own gradient after the allreduce, so only rank 1 sees it; for the
// others a loss times inf); reference: that step is never taken. Each rank writes its final
// weights to DIR/<MODE>-<rank>.pt.
DTORCH_TEST_WORKER(fp16_overflow) {
  const std::string dir = args.at(0), strategy = args.at(1), mode = args.at(2);
  auto comm = comm::Communicator::from_env();
  torch::manual_seed(5);
  auto model = models::make_model("gpt-debug");
  StrategyConfig c;
  c.kind = *value_named<StrategyKind>(strategy);
  c.optimizer.kind = OptimizerKind::AdamW;
  c.optimizer.lr = 1e-3;
  c.precision.compute = Precision::FP16;
  c.precision.loss_scale.initial_scale_power = 8;
  // The overflow is absorbed by the hysteresis: the scale stays, so every later step runs at
  // the scale the reference's does (fp16 rounds gradients differently at another scale).
  c.precision.loss_scale.hysteresis = 2;
  c.ddp.bucket_cap_mb = 0.01;
  auto s = make_strategy(c, model, comm);
  DTORCH_CHECK(s->loss_scale() == 256, "the scale starts at 2^8, not ", s->loss_scale());
  for (int step = 0; step < 5; ++step) {
    if (mode == "reference" && step == kSkippedStep) continue;
    torch::manual_seed(100 * step + comm->rank());
    auto x = torch::randint(0, 256, {2, 16}, torch::kLong);
    auto y = torch::roll(x, 1, 1);
    torch::Tensor loss;
    {
      parallel::Autocast autocast(s->autocast());
      loss = cross_entropy(model->forward(x), y);
    }
    const bool inject = mode == "inject" && step == kSkippedStep && comm->rank() == 1;
    if (inject && strategy != "ddp") loss = loss * std::numeric_limits<float>::infinity();
    s->backward(loss, true);
    if (inject && strategy == "ddp") {
      torch::NoGradGuard no_grad;
      model->parameters()[3].mutable_grad().view({-1})[0] = std::numeric_limits<float>::infinity();
    }
    std::vector<torch::Tensor> before;
    {
      auto whole = s->whole_parameters();
      for (const auto& p : model->parameters())
        before.push_back(p.detach().clone());
    }
    s->step(1.0);
    auto whole = s->whole_parameters();
    const auto after = model->parameters();
    bool same = true;
    for (size_t i = 0; i < before.size(); ++i)
      same = same && before[i].equal(after[i]);
    const bool skipped = mode == "inject" && step == kSkippedStep;
    DTORCH_CHECK(same == skipped, "rank ", comm->rank(), " step ", step,
                 skipped ? " should have been skipped" : " changed no weight");
  }
  const bool injected = mode == "inject";
  DTORCH_CHECK(s->loss_scale() == 256, "scale ", s->loss_scale());
  DTORCH_CHECK(s->skipped_steps() == (injected ? 1 : 0), "skipped ", s->skipped_steps());
  auto whole = s->whole_parameters();
  checkpoint::save_state_dict(*model, str(dir, "/", mode, "-", comm->rank(), ".pt"));
}

class LossScalingSteps : public ::testing::TestWithParam<const char*> {};

TEST_P(LossScalingSteps, AnOverflowOnOneRankSkipsTheStepEverywhere) {
  if (!compat::kTorch2) GTEST_SKIP() << "LibTorch 1.13's CPU autocast has no float16";
  const std::string strategy = GetParam();
  const std::string dir = testing::scratch_dir("fp16_overflow_" + strategy);
  ASSERT_EQ(testing::run_ranks(2, "fp16_overflow", {dir, strategy, "inject"}), 0);
  ASSERT_EQ(testing::run_ranks(2, "fp16_overflow", {dir, strategy, "reference"}), 0);
  for (int rank : {0, 1}) {
    auto got = testing::model_file(str(dir, "/inject-", rank, ".pt"));
    auto want = testing::model_file(str(dir, "/reference-", rank, ".pt"));
    ASSERT_EQ(got.size(), want.size());
    for (const auto& [name, t] : want)
      EXPECT_TRUE(torch::allclose(got.at(name), t, 1e-6, 1e-7)) << strategy << " " << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Strategies, LossScalingSteps,
                         ::testing::Values("ddp", "zero1", "zero2", "zero3"));

TEST(LossScalingCli, TrainRecordsTheScaleOrRefusesWithoutFp16Autocast) {
  const std::string out = testing::scratch_dir("fp16_cli") + "/run";
  auto r =
      testing::run_command("fp16_cli",
                           testing::with(testing::gpt_debug_train_args(out, "ddp", 1, 2),
                                         {"--precision", "fp16", "--initial-scale-power", "10"}),
                           300);
  if (!compat::kTorch2) {
    EXPECT_NE(r.exit_code(), 0);
    EXPECT_TRUE(testing::contains(r.err, "--precision fp16 on the CPU needs LibTorch 2.x"))
        << r.err;
    return;
  }
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  auto e = testing::epochs_of(out);
  ASSERT_EQ(e.size(), 2u);
  EXPECT_LT(e[1]["train_loss"].get<double>(), e[0]["train_loss"].get<double>());
  EXPECT_GE(e[1]["loss_scale"].get<double>(), 1.0) << e[1].dump();
  EXPECT_LE(e[1]["loss_scale"].get<double>(), 2048.0) << e[1].dump();
  EXPECT_TRUE(testing::contains(r.err, "loss scale")) << r.err;

  // Starting at 2^30 the first steps overflow and are skipped, halving the scale each time
  // (hysteresis 1), and a skipped step does not advance the learning-rate schedule.
  const std::string high = testing::scratch_dir("fp16_cli_high") + "/run";
  auto h = testing::run_command(
      "fp16_cli_high",
      testing::with(testing::gpt_debug_train_args(high, "ddp", 1, 2),
                    {"--precision", "fp16", "--initial-scale-power", "30", "--hysteresis", "1",
                     "--lr-schedule", "warmup-linear", "--warmup-steps", "30"}),
      300);
  ASSERT_EQ(h.exit_code(), 0) << h.err;
  auto he = testing::epochs_of(high);
  ASSERT_EQ(he.size(), 2u);
  const auto skipped = he[1]["skipped_steps"].get<int64_t>();
  EXPECT_GE(skipped, 5) << he[1].dump();
  EXPECT_LT(he[1]["loss_scale"].get<double>(), std::ldexp(1.0, 30 - 4)) << he[1].dump();
  LrScheduleConfig warmup{LrScheduleKind::WarmupLinear, 30, 0};
  const int64_t steps = he[1]["step"].get<int64_t>();
  EXPECT_DOUBLE_EQ(he[1]["lr"].get<double>(), lr_at(warmup, 0.002, steps - skipped - 1, steps))
      << he[1].dump();
}

}  // namespace
}  // namespace dtorch::train
