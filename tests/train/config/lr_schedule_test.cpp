// Tests for the learning-rate schedules (Note [Learning-rate schedules]): their shape, their
// errors, and every step's rate against torch.optim.lr_scheduler in Python.
#include "dtorch/train/config/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

#include "dtorch/core/error.h"
#include "models/python_peer.h"
#include "support/workers.h"

namespace dtorch::train {
namespace {

std::vector<double> curve(const LrScheduleConfig& c, double lr, int64_t total) {
  std::vector<double> v;
  for (int64_t s = 0; s < total; ++s)
    v.push_back(lr_at(c, lr, s, total));
  return v;
}

TEST(LrSchedule, ConstantIsTheRateAfterAnOptionalWarmup) {
  EXPECT_EQ(curve({}, 0.1, 3), (std::vector<double>{0.1, 0.1, 0.1}));
  EXPECT_EQ(curve({LrScheduleKind::Constant, 4, 0}, 0.1, 6),
            (std::vector<double>{0.025, 0.05, 0.1 * 3 / 4, 0.1, 0.1, 0.1}));
}

TEST(LrSchedule, DecaysReachMinLrAtTheEndAndStayThere) {
  for (LrScheduleKind k : {LrScheduleKind::WarmupLinear, LrScheduleKind::WarmupCosine}) {
    const std::string& kind = name_of(k);
    LrScheduleConfig c{k, 2, 0.01};
    EXPECT_NEAR(lr_at(c, 1.0, 0, 10), 0.5, 1e-15) << kind;
    EXPECT_NEAR(lr_at(c, 1.0, 2, 10), 1.0, 1e-15) << kind << ": the peak right after warm-up";
    EXPECT_NEAR(lr_at(c, 1.0, 6, 10), 0.505, 1e-12) << kind << ": halfway between 1 and 0.01";
    EXPECT_NEAR(lr_at(c, 1.0, 10, 10), 0.01, 1e-15) << kind;
    EXPECT_NEAR(lr_at(c, 1.0, 25, 10), 0.01, 1e-15) << kind << ": past the end";
    auto v = curve(c, 1.0, 10);
    for (size_t s = 3; s < v.size(); ++s)
      EXPECT_LT(v[s], v[s - 1]) << kind << " step " << s;
  }
}

TEST(LrSchedule, OneCycleRisesFromATwentyFifthToThePeakAndFallsBelowTheStart) {
  LrScheduleConfig c{LrScheduleKind::OneCycle, 0, 0};
  auto v = curve(c, 1.0, 100);
  EXPECT_NEAR(v[0], 1.0 / 25, 1e-15);
  EXPECT_NEAR(v[29], 1.0, 1e-15) << "30% of the steps rise by default";
  EXPECT_NEAR(v[99], 1.0 / 25 / 1e4, 1e-15);
  c.warmup_steps = 10;
  c.min_lr = 0.001;
  EXPECT_NEAR(lr_at(c, 1.0, 9, 100), 1.0, 1e-15);
  EXPECT_NEAR(lr_at(c, 1.0, 99, 100), 0.001, 1e-15);
  EXPECT_NEAR(lr_at(c, 1.0, 500, 100), 0.001, 1e-15) << "past the end";
}

void expect_config_error(const LrScheduleConfig& c, double lr, int64_t total,
                         const std::string& says) {
  try {
    validate(c, lr, total);
    ADD_FAILURE() << "expected an error saying " << says;
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
  }
}

TEST(LrSchedule, BadSettingsNameTheFlag) {
  expect_config_error({LrScheduleKind::Constant, -1, 0}, 0.1, 10, "--warmup-steps must be >= 0");
  expect_config_error({LrScheduleKind::WarmupCosine, 0, 0.5}, 0.1, 10,
                      "--min-lr 0.5 must lie between 0");
  expect_config_error({LrScheduleKind::WarmupLinear, 20, 0}, 0.1, 10,
                      "--warmup-steps 20 is longer than");
  expect_config_error({LrScheduleKind::OneCycle, 10, 0}, 0.1, 10, "--warmup-steps between 2 and 9");
  expect_config_error({LrScheduleKind::OneCycle, 0, 0}, 0.1, 3, "30% of the 3 steps");
  EXPECT_NO_THROW(validate({LrScheduleKind::OneCycle, 0, 0}, 0.1, 10));
  EXPECT_NO_THROW(validate({LrScheduleKind::WarmupLinear, 20, 0}, 0.1, 0))
      << "length not known yet";
}

// Each schedule against the torch.optim.lr_scheduler classes the Note names, stepped as a
// training loop steps them: the rate read before each optimizer step.
TEST(LrSchedule, EveryStepMatchesPyTorchsSchedulers) {
  DTORCH_SKIP_WITHOUT_PYTHON(/*need_peer=*/false);
  const int64_t T = 40, W = 6;
  const double lr = 0.1, m = 0.001;
  std::string out;
  int rc = testing::run_python(
      testing::scratch_dir("lr-schedule-python"), "schedules", R"PY(
import json, sys
from torch.optim.lr_scheduler import LinearLR, CosineAnnealingLR, OneCycleLR
T, W, lr, m = int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
def rates(make, steps):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=lr)
    sched = make(opt)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out
warm = rates(lambda o: LinearLR(o, start_factor=1 / W, end_factor=1.0, total_iters=W - 1), W)
print("RESULT " + json.dumps({
    "constant": warm + [lr] * (T - W),
    "warmup-linear": warm + rates(lambda o: LinearLR(o, 1.0, m / lr, total_iters=T - W), T - W),
    "warmup-cosine": warm + rates(lambda o: CosineAnnealingLR(o, T_max=T - W, eta_min=m), T - W),
    "onecycle": rates(lambda o: OneCycleLR(o, max_lr=lr, total_steps=T, pct_start=W / T,
                                           final_div_factor=lr / 25 / m,
                                           cycle_momentum=False), T),
    "onecycle-default": rates(lambda o: OneCycleLR(o, max_lr=lr, total_steps=T,
                                                   cycle_momentum=False), T),
}))
)PY",
      {std::to_string(T), std::to_string(W), std::to_string(lr), std::to_string(m)}, &out);
  ASSERT_EQ(rc, 0) << out;
  auto want = testing::printed_result(out);
  ASSERT_FALSE(want.is_discarded()) << out;
  std::map<std::string, LrScheduleConfig> ours{
      {"constant", {LrScheduleKind::Constant, W, 0}},
      {"warmup-linear", {LrScheduleKind::WarmupLinear, W, m}},
      {"warmup-cosine", {LrScheduleKind::WarmupCosine, W, m}},
      {"onecycle", {LrScheduleKind::OneCycle, W, m}},
      {"onecycle-default", {LrScheduleKind::OneCycle, 0, 0}}};
  for (const auto& [name, c] : ours) {
    auto got = curve(c, lr, T);
    auto expected = want.at(name).get<std::vector<double>>();
    ASSERT_EQ(got.size(), expected.size()) << name;
    for (size_t s = 0; s < got.size(); ++s)
      EXPECT_NEAR(got[s], expected[s], 1e-9 * lr) << name << " step " << s;
  }
}

// DeepSpeed's schedulers (kinds WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle) against
// deepspeed.runtime.lr_schedules, stepped as DeepSpeed's engine steps them: the rate read before
// each optimizer step, the scheduler stepped after it.
TEST(LrSchedule, DeepSpeedKindsMatchDeepSpeedsSchedulersEveryStep) {
  DTORCH_SKIP_WITHOUT_PYTHON(/*need_peer=*/false);
  const int64_t T = 40;
  const double peak = 0.1;
  std::map<std::string, std::pair<LrScheduleConfig, std::string>> cases;
  auto add = [&](const std::string& name, LrScheduleConfig c, const std::string& python) {
    cases[name] = {c, python};
  };
  DeepSpeedScheduleParams p;
  p.warmup_min_lr = 0.001;
  add("warmup-log", {LrScheduleKind::DeepSpeedWarmupLR, 10, 0, p},
      "WarmupLR(o, warmup_min_lr=0.001, warmup_max_lr=0.1, warmup_num_steps=10)");
  p.warmup_type = "linear";
  add("warmup-linear", {LrScheduleKind::DeepSpeedWarmupLR, 10, 0, p},
      "WarmupLR(o, warmup_min_lr=0.001, warmup_max_lr=0.1, warmup_num_steps=10, "
      "warmup_type='linear')");
  p = {};
  p.total_num_steps = 30;
  add("decay", {LrScheduleKind::DeepSpeedWarmupDecayLR, 8, 0, p},
      "WarmupDecayLR(o, total_num_steps=30, warmup_max_lr=0.1, warmup_num_steps=8)");
  p.warmup_min_ratio = 0.1;
  p.cos_min_ratio = 0.01;
  add("cosine-log", {LrScheduleKind::DeepSpeedWarmupCosineLR, 6, 0, p},
      "WarmupCosineLR(o, total_num_steps=30, warmup_min_ratio=0.1, warmup_num_steps=6, "
      "cos_min_ratio=0.01)");
  p.warmup_type = "linear";
  add("cosine-linear", {LrScheduleKind::DeepSpeedWarmupCosineLR, 6, 0, p},
      "WarmupCosineLR(o, total_num_steps=30, warmup_min_ratio=0.1, warmup_num_steps=6, "
      "cos_min_ratio=0.01, warmup_type='linear')");
  p = {};
  p.cycle_min_lr = 0.01;
  p.cycle_first_step_size = 8;
  p.cycle_second_step_size = 6;
  p.decay_lr_rate = 0.5;
  p.decay_step_size = 3;
  add("onecycle", {LrScheduleKind::DeepSpeedOneCycle, 8, 0, p},
      "OneCycle(o, cycle_min_lr=0.01, cycle_max_lr=0.1, cycle_first_step_size=8, "
      "cycle_second_step_size=6, decay_lr_rate=0.5, decay_step_size=3, cycle_momentum=False)");
  p = {};
  p.cycle_min_lr = 0.01;
  p.cycle_first_step_size = 10;
  p.cycle_first_stair_count = 3;
  add("onecycle-stairs", {LrScheduleKind::DeepSpeedOneCycle, 10, 0, p},
      "OneCycle(o, cycle_min_lr=0.01, cycle_max_lr=0.1, cycle_first_step_size=10, "
      "cycle_first_stair_count=3, cycle_momentum=False)");

  std::string code = R"PY(
import logging
try:
    from deepspeed.runtime.lr_schedules import WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle
except ImportError as e:
    print("NO_DEEPSPEED", e)
    sys.exit(0)
logging.disable(logging.WARNING)
def rates(make, steps=int(sys.argv[2])):
    p = torch.nn.Parameter(torch.zeros(1))
    o = torch.optim.SGD([p], lr=0.1)
    sched = make(o)
    out = []
    for _ in range(steps):
        out.append(o.param_groups[0]["lr"])
        o.step()
        sched.step()
    return out
result = {}
)PY";
  for (const auto& [name, c] : cases)
    code += "result['" + name + "'] = rates(lambda o: " + c.second + ")\n";
  code += "print('RESULT ' + json.dumps(result))\n";
  std::string out;
  int rc = testing::run_python(testing::scratch_dir("lr-schedule-deepspeed"), "ds_schedules", code,
                               {std::to_string(T)}, &out);
  ASSERT_EQ(rc, 0) << out;
  if (out.find("NO_DEEPSPEED") != std::string::npos) {
    GTEST_SKIP() << "DeepSpeed is not installed for " << testing::python()
                 << " (make test installs it): " << out;
  }
  auto want = testing::printed_result(out);
  ASSERT_FALSE(want.is_discarded()) << out;
  for (const auto& [name, c] : cases) {
    auto got = curve(c.first, peak, T);
    auto expected = want.at(name).get<std::vector<double>>();
    ASSERT_EQ(got.size(), expected.size()) << name;
    for (size_t s = 0; s < got.size(); ++s)
      EXPECT_NEAR(got[s], expected[s], 1e-12) << name << " step " << s;
  }
}

TEST(LrSchedule, DeepSpeedKindsRoundTripThroughJson) {
  DeepSpeedScheduleParams p;
  p.cycle_min_lr = 0.01;
  p.cycle_first_stair_count = 3;
  LrScheduleConfig c{LrScheduleKind::DeepSpeedOneCycle, 10, 0, p};
  nlohmann::json j = c;
  EXPECT_EQ(j.at("deepspeed").at("cycle_first_stair_count"), 3);
  auto back = j.get<LrScheduleConfig>();
  EXPECT_EQ(nlohmann::json(back), j);
  EXPECT_FALSE(nlohmann::json(LrScheduleConfig{}).contains("deepspeed"));
  j["kind"] = "cosine";  // a checkpoint's schedule this dtorch does not know
  try {
    j.get<LrScheduleConfig>();
    ADD_FAILURE() << "no error for kind 'cosine'";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown learning-rate schedule 'cosine'"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(validate({LrScheduleKind::DeepSpeedWarmupLR, 0, 0, {}}, 0.1), ConfigError)
      << "warmup_num_steps 0";
  DeepSpeedScheduleParams bad;
  bad.warmup_type = "exp";
  EXPECT_THROW(validate({LrScheduleKind::DeepSpeedWarmupLR, 5, 0, bad}, 0.1), ConfigError);
}

}  // namespace
}  // namespace dtorch::train
