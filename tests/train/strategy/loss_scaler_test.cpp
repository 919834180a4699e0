// Tests for fp16 loss scaling (Note [Loss scaling]): scale sequences worked out by hand from
// DeepSpeed's rule, the overflow check and unscaling on every floating dtype, the checkpoint
// state, and every step against DeepSpeed's own DynamicLossScaler in Python.
#include "dtorch/train/strategy/loss_scaler.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "dtorch/core/error.h"
#include "models/python_peer.h"
#include "support/error_of.h"
#include "support/workers.h"

namespace dtorch::train {
namespace {

LossScaleConfig scaler_config(int power, int window, int hysteresis, bool consecutive = false,
                              double min_scale = 1) {
  LossScaleConfig c;
  c.initial_scale_power = power;
  c.loss_scale_window = window;
  c.hysteresis = hysteresis;
  c.consecutive_hysteresis = consecutive;
  c.min_loss_scale = min_scale;
  return c;
}

// The scale after each update() of `flags` ('o' an overflow, '.' none).
std::vector<double> scales_after(LossScaler& s, const std::string& flags) {
  std::vector<double> out;
  for (char f : flags) {
    EXPECT_EQ(s.update(f == 'o'), f != 'o') << "a step is taken exactly when nothing overflowed";
    out.push_back(s.scale());
  }
  return out;
}

using Scales = std::vector<double>;

TEST(LossScaler, DefaultsAreDeepSpeeds) {
  LossScaleConfig c;
  EXPECT_EQ(c.loss_scale, 0);
  EXPECT_TRUE(c.dynamic());
  EXPECT_EQ(c.initial_scale_power, 16);
  EXPECT_EQ(c.loss_scale_window, 1000);
  EXPECT_EQ(c.hysteresis, 2);
  EXPECT_FALSE(c.consecutive_hysteresis);
  EXPECT_EQ(c.min_loss_scale, 1);
  EXPECT_EQ(LossScaler(c).scale(), 65536);
}

TEST(LossScaler, DoublesAfterTheWindowPlusOneCleanSteps) {
  LossScaler s(scaler_config(4, 3, 2));
  // Step i doubles when i - (-1) - 1 = i is a positive multiple of 3.
  EXPECT_EQ(scales_after(s, "......."), (Scales{16, 16, 16, 32, 32, 32, 64}));
  EXPECT_EQ(s.steps(), 7);
  EXPECT_EQ(s.skipped(), 0);
  // After an overflow at step k, the next doubling is at k + 1 + window.
  LossScaler t(scaler_config(4, 2, 1));
  EXPECT_EQ(scales_after(t, "o....."), (Scales{8, 8, 8, 16, 16, 32}));
}

TEST(LossScaler, HysteresisTwoAbsorbsOneOverflow) {
  LossScaler s(scaler_config(4, 100, 2));
  EXPECT_EQ(scales_after(s, "o"), (Scales{16})) << "absorbed, the step still skipped";
  EXPECT_EQ(s.hysteresis_left(), 1);
  EXPECT_EQ(scales_after(s, "oo."), (Scales{8, 4, 4})) << "nothing left to absorb";
  EXPECT_EQ(s.skipped(), 3);
  // Without consecutive_hysteresis only a doubling refills it: an overflow long after the first
  // halves the scale.
  LossScaler t(scaler_config(4, 100, 2));
  EXPECT_EQ(scales_after(t, "o..o"), (Scales{16, 16, 16, 8}));
  // A doubling refills it: window 2 after the overflow at step 0 doubles at step 3.
  LossScaler u(scaler_config(4, 2, 2));
  EXPECT_EQ(scales_after(u, "o...o"), (Scales{16, 16, 16, 32, 32}));
  EXPECT_EQ(u.hysteresis_left(), 1);
  LossScaler one(scaler_config(4, 100, 1));
  EXPECT_EQ(scales_after(one, "o.o"), (Scales{8, 8, 4})) << "hysteresis 1 halves every time";
}

TEST(LossScaler, ConsecutiveHysteresisRefillsAfterEveryCleanStep) {
  LossScaler s(scaler_config(4, 100, 2, /*consecutive=*/true));
  EXPECT_EQ(scales_after(s, "o.o.o."), (Scales{16, 16, 16, 16, 16, 16}))
      << "isolated overflows are all absorbed";
  EXPECT_EQ(scales_after(s, "oo"), (Scales{16, 8})) << "two in a row halve it";
  EXPECT_EQ(scales_after(s, "o"), (Scales{4})) << "and the next in the run too";
  EXPECT_EQ(s.skipped(), 6);
  // The window counts from the last overflow whether it was absorbed or not.
  LossScaler t(scaler_config(4, 2, 2, /*consecutive=*/true));
  EXPECT_EQ(scales_after(t, "o...."), (Scales{16, 16, 16, 32, 32}));
}

TEST(LossScaler, StopsAtTheFloorAsDeepSpeedDoes) {
  LossScaler s(scaler_config(2, 100, 1, false, /*min_scale=*/1));
  EXPECT_EQ(scales_after(s, "oo"), (Scales{2, 1}));
  const std::string e = testing::error_of<Error>([&] { s.update(true); });
  EXPECT_NE(e.find("already at its minimum (--min-loss-scale 1)"), std::string::npos) << e;
  EXPECT_EQ(s.scale(), 1);
  EXPECT_EQ(s.steps(), 2) << "the failed update changed nothing";
  // Halving stops at a floor between two powers of two; the next overflow is the error.
  LossScaler t(scaler_config(2, 100, 1, false, /*min_scale=*/1.5));
  EXPECT_EQ(scales_after(t, "oo"), (Scales{2, 1.5}));
  EXPECT_NE(testing::error_of<Error>([&] { t.update(true); }), "(no error)");
  // With hysteresis left, an overflow at the floor is absorbed first.
  LossScaler u(scaler_config(0, 100, 2));
  EXPECT_EQ(scales_after(u, "o"), (Scales{1}));
  EXPECT_NE(testing::error_of<Error>([&] { u.update(true); }), "(no error)");
  // Clean steps at the floor are fine, and the scale grows from it.
  LossScaler v(scaler_config(0, 1, 1));
  EXPECT_EQ(scales_after(v, "..."), (Scales{1, 2, 4}));
}

TEST(LossScaler, AStaticScaleNeverChangesButStillSkips) {
  LossScaleConfig c = scaler_config(4, 1, 1);
  c.loss_scale = 128;
  EXPECT_FALSE(c.dynamic());
  LossScaler s(c);
  EXPECT_EQ(scales_after(s, "oooo....o.o"), Scales(11, 128.0));
  EXPECT_EQ(s.skipped(), 6);
  EXPECT_EQ(s.steps(), 11);
}

TEST(LossScaler, BadSettingsNameTheFlag) {
  auto error = [](LossScaleConfig c) { return testing::error_of([&] { validate(c); }); };
  LossScaleConfig c;
  EXPECT_EQ(error(c), "(no error)");
  c.loss_scale = -1;
  EXPECT_NE(error(c).find("--loss-scale -1: give 0 for dynamic"), std::string::npos);
  c.loss_scale = std::numeric_limits<double>::infinity();
  EXPECT_NE(error(c).find("--loss-scale inf"), std::string::npos);
  c = {};
  c.initial_scale_power = 65;
  EXPECT_NE(error(c).find("--initial-scale-power 65"), std::string::npos);
  c = {};
  c.loss_scale_window = 0;
  EXPECT_NE(error(c).find("--loss-scale-window 0"), std::string::npos);
  c = {};
  c.hysteresis = 0;
  EXPECT_NE(error(c).find("--hysteresis 0"), std::string::npos);
  c = {};
  c.min_loss_scale = 0;
  EXPECT_NE(error(c).find("--min-loss-scale 0"), std::string::npos);
  c = {};
  c.initial_scale_power = 2;
  c.min_loss_scale = 8;
  EXPECT_NE(error(c).find("--min-loss-scale 8 is above the initial scale 2^2 = 4"),
            std::string::npos)
      << error(c);
  c.loss_scale = 16;
  c.hysteresis = 0;
  EXPECT_EQ(error(c), "(no error)") << "a static scale uses none of the dynamic settings";
  EXPECT_THROW(LossScaler(scaler_config(4, 0, 1)), ConfigError);
}

// Tensors of `dtype`, one of them undefined and one empty, with `bad` written at one element
// of the last (a 3-d one) when not 0.
std::vector<at::Tensor> gradients_of(at::ScalarType dtype, double bad, const at::Device& device) {
  auto opts = torch::TensorOptions().dtype(dtype).device(device);
  std::vector<at::Tensor> t{torch::linspace(-3, 3, 7, opts), at::Tensor(), torch::empty({0}, opts),
                            torch::full({4, 5, 6}, 0.5, opts)};
  if (bad != 0) t.back().index_put_({2, 3, 1}, bad);
  return t;
}

bool has_inf_or_nan(const std::vector<at::Tensor>& tensors, const at::Device& device) {
  const at::Tensor flag = non_finite_flag(tensors, device);
  EXPECT_EQ(flag.device(), device);
  return flag.item<float>() != 0;
}

void expect_overflow_found(const at::Device& device) {
  const double inf = std::numeric_limits<double>::infinity();
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf, at::kDouble}) {
    SCOPED_TRACE(c10::toString(dtype));
    EXPECT_FALSE(has_inf_or_nan(gradients_of(dtype, 0, device), device));
    EXPECT_TRUE(has_inf_or_nan(gradients_of(dtype, inf, device), device));
    EXPECT_TRUE(has_inf_or_nan(gradients_of(dtype, -inf, device), device));
    EXPECT_TRUE(has_inf_or_nan(gradients_of(dtype, std::nan(""), device), device));
  }
  // fp16's largest finite value many times over: finite (a sum would have overflowed).
  EXPECT_FALSE(has_inf_or_nan(
      {torch::full({4096}, 65504.0, torch::dtype(at::kHalf).device(device))}, device));
  // Mixed dtypes in one list, the bad element in the bf16 one.
  auto bf16 = torch::ones({3}, torch::dtype(at::kBFloat16).device(device));
  std::vector<at::Tensor> mixed{torch::ones({3}, torch::dtype(at::kHalf).device(device)), bf16,
                                torch::ones({2}, torch::dtype(at::kFloat).device(device))};
  EXPECT_FALSE(has_inf_or_nan(mixed, device));
  bf16.index_put_({1}, std::nan(""));
  EXPECT_TRUE(has_inf_or_nan(mixed, device));
  EXPECT_FALSE(has_inf_or_nan({}, device));
  EXPECT_FALSE(has_inf_or_nan({at::Tensor()}, device));
}

TEST(LossScaler, FindsInfAndNanInAnyOfSeveralTensors) {
  expect_overflow_found(at::kCPU);
}

TEST(LossScaler, FindsInfAndNanOnCuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  expect_overflow_found(at::Device(at::kCUDA, 0));
}

TEST(LossScaler, UnscaleMultipliesDefinedTensorsInPlace) {
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    SCOPED_TRACE(c10::toString(dtype));
    auto g = gradients_of(dtype, 0, at::kCPU);
    std::vector<at::Tensor> before;
    for (const auto& t : g)
      before.push_back(t.defined() ? t.to(at::kDouble) : t);
    const void* data = g[0].data_ptr();
    unscale(g, torch::scalar_tensor(1.0 / 1024));
    EXPECT_EQ(g[0].data_ptr(), data) << "in place";
    EXPECT_FALSE(g[1].defined());
    for (size_t i : {0, 3}) {
      EXPECT_EQ(g[i].scalar_type(), dtype);
      EXPECT_TRUE(torch::equal(g[i].to(at::kDouble), before[i] / 1024)) << "powers of two: exact";
    }
  }
  std::vector<at::Tensor> mixed{torch::full({2}, 6.0), at::Tensor(),
                                torch::full({3}, 6.0, torch::kHalf)};
  unscale(mixed, torch::scalar_tensor(0.5));
  EXPECT_TRUE(torch::equal(mixed[0], torch::full({2}, 3.0)));
  EXPECT_TRUE(torch::equal(mixed[2], torch::full({3}, 3.0, torch::kHalf)));
  std::vector<at::Tensor> none{at::Tensor()};
  unscale(none, torch::scalar_tensor(0.5));
}

// The rule on the device (update_on_device, tensors only) against the host's update() over
// random overflows, for dynamic scales of every hysteresis setting and a static one: the five
// numbers agree after every step, up to the floor, where the host raises the error and the
// device holds the scale at min_loss_scale.
TEST(LossScaler, TheDevicesRuleIsTheHosts) {
  std::vector<LossScaleConfig> configs;
  for (int hysteresis : {1, 2, 3})
    for (bool consecutive : {false, true})
      for (int window : {1, 3}) {
        LossScaleConfig c = scaler_config(6, window, hysteresis);
        c.consecutive_hysteresis = consecutive;
        c.min_loss_scale = std::ldexp(1.0, -10);
        configs.push_back(c);
      }
  configs.push_back(LossScaleConfig{});
  configs.back().loss_scale = 64;
  for (size_t k = 0; k < configs.size(); ++k) {
    SCOPED_TRACE("config " + std::to_string(k));
    const LossScaleConfig& c = configs[k];
    LossScaler host(c);
    at::Tensor device = host.state_tensor(at::kCPU);
    auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(k) + 1);
    int steps = 0;
    for (; steps < 300; ++steps) {
      const bool overflow = at::rand({1}, gen).item<double>() < 0.3;
      update_on_device(c, device, torch::full({1}, overflow ? 1.0f : 0.0f));
      try {
        host.update(overflow);
      } catch (const Error&) {
        EXPECT_EQ(device[0].item<double>(), c.min_loss_scale);
        break;
      }
      ASSERT_TRUE(host.same_state(device))
          << "step " << steps << ": device " << device << ", host " << host.to_json().dump();
    }
    EXPECT_GE(steps, 20);
  }
}

TEST(LossScaler, CheckpointStateRoundTripsAndTheRunContinuesAlike) {
  const auto c = scaler_config(6, 3, 2);
  LossScaler a(c);
  scales_after(a, "o..o....oo.");
  const nlohmann::json state = a.to_json();
  EXPECT_EQ(state.at("scale"), a.scale());
  EXPECT_EQ(state.at("cur_iter"), 11);
  EXPECT_EQ(state.at("last_overflow_iter"), 9);
  EXPECT_EQ(state.at("skipped"), 4);
  LossScaler b = LossScaler::from_json(c, nlohmann::json::parse(state.dump()));
  EXPECT_EQ(b.to_json(), state);
  const std::string rest = "..o.......ooo...o.";
  EXPECT_EQ(scales_after(b, rest), scales_after(a, rest));
  EXPECT_EQ(b.to_json(), a.to_json());

  LossScaleConfig fixed = c;
  fixed.loss_scale = 512;
  EXPECT_EQ(LossScaler::from_json(fixed, state).scale(), 512) << "a static scale is the flag's";
  EXPECT_EQ(LossScaler::from_json(fixed, state).steps(), 11);
}

TEST(LossScaler, AMalformedStateNamesTheField) {
  const auto c = scaler_config(6, 3, 2);
  const nlohmann::json good = LossScaler(c).to_json();
  auto error_with = [&](const std::string& key, const nlohmann::json& value) {
    nlohmann::json j = good;
    if (value.is_discarded())
      j.erase(key);
    else
      j[key] = value;
    return testing::error_of<CheckpointError>([&] { LossScaler::from_json(c, j); });
  };
  const auto missing = nlohmann::json(nlohmann::json::value_t::discarded);
  EXPECT_NE(error_with("cur_iter", missing).find("has no 'cur_iter'"), std::string::npos);
  EXPECT_NE(error_with("scale", missing).find("has no 'scale'"), std::string::npos);
  EXPECT_NE(error_with("scale", "big").find("'scale' \"big\""), std::string::npos);
  EXPECT_NE(error_with("scale", 0).find("'scale' 0, which must be a number above 0"),
            std::string::npos);
  EXPECT_NE(error_with("cur_hysteresis", 0).find("'cur_hysteresis' 0"), std::string::npos);
  EXPECT_NE(error_with("cur_iter", 1.5).find("'cur_iter' 1.5"), std::string::npos);
  EXPECT_NE(error_with("last_overflow_iter", 0).find("'last_overflow_iter' 0"), std::string::npos)
      << "an overflow at or after the step count";
  EXPECT_NE(error_with("skipped", 1).find("'skipped' 1"), std::string::npos);
  EXPECT_NE(testing::error_of<CheckpointError>([&] {
              LossScaler::from_json(c, 7);
            }).find("must be a JSON object"),
            std::string::npos);
}

// DeepSpeed's own DynamicLossScaler through 300 pseudo-random overflow flags, window 5 and
// hysteresis 2 (and a case that reaches its floor), for both consecutive_hysteresis values:
// after every step the scale and the hysteresis left must be DeepSpeed's, and an overflow at
// the floor must fail at DeepSpeed's step.
TEST(LossScalerPython, EveryStepMatchesDeepSpeedsDynamicLossScaler) {
  DTORCH_SKIP_WITHOUT_PYTHON(/*need_peer=*/false);
  struct Case {
    LossScaleConfig c;
    double p_overflow;
    bool to_the_end;  // whether all 300 steps stay above the floor
  };
  std::vector<Case> cases;
  for (bool consecutive : {false, true}) {
    cases.push_back({scaler_config(16, 5, 2, consecutive, 1), 0.12, true});
    cases.push_back({scaler_config(10, 5, 2, consecutive, 1), 0.25, consecutive});
    cases.push_back({scaler_config(12, 3, 3, consecutive, 4), 0.5, false});
  }
  // Knuth's MMIX generator, so that the flags are the same with every standard library.
  uint64_t state = 20261126;
  auto uniform = [&state] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<double>(state >> 11) * 0x1.0p-53;
  };
  nlohmann::json spec = nlohmann::json::array();
  std::vector<std::string> flags;
  for (const auto& k : cases) {
    std::string f;
    for (int i = 0; i < 300; ++i)
      f += uniform() < k.p_overflow ? 'o' : '.';
    flags.push_back(f);
    spec.push_back({{"power", k.c.initial_scale_power},
                    {"window", k.c.loss_scale_window},
                    {"hysteresis", k.c.hysteresis},
                    {"consecutive", k.c.consecutive_hysteresis},
                    {"min_scale", k.c.min_loss_scale},
                    {"flags", f}});
  }
  const auto dir = testing::scratch_dir("loss-scaler-deepspeed");
  std::ofstream(dir + "/cases.json") << spec.dump();
  std::string out;
  int rc = testing::run_python(dir, "ds_loss_scaler", R"PY(
import logging, types
try:
    import deepspeed.runtime.fp16.loss_scaler as ls
except ImportError as e:
    print("NO_DEEPSPEED", e)
    sys.exit(0)
logging.disable(logging.WARNING)
# update_scale asks deepspeed.comm for the rank to decide who logs; no process group here.
ls.dist = types.SimpleNamespace(get_rank=lambda: 0)
result = []
for case in json.load(open(sys.argv[2])):
    s = ls.DynamicLossScaler(init_scale=2 ** case["power"], scale_window=case["window"],
                             min_scale=case["min_scale"], delayed_shift=case["hysteresis"],
                             consecutive_hysteresis=case["consecutive"])
    steps = []
    for f in case["flags"]:
        try:
            s.update_scale(f == "o")
        except Exception as e:
            if "minimum" not in str(e):
                raise
            steps.append("raised")
            break
        steps.append([s.cur_scale, s.cur_hysteresis])
    result.append(steps)
print("RESULT " + json.dumps(result))
)PY",
                               {dir + "/cases.json"}, &out);
  ASSERT_EQ(rc, 0) << out;
  if (out.find("NO_DEEPSPEED") != std::string::npos) {
    GTEST_SKIP() << "DeepSpeed is not installed for " << testing::python()
                 << " (make test installs it): " << out;
  }
  const auto want = testing::printed_result(out);
  ASSERT_FALSE(want.is_discarded()) << out;
  ASSERT_EQ(want.size(), cases.size());
  int raised = 0, grew = 0, absorbed = 0;
  for (size_t k = 0; k < cases.size(); ++k) {
    SCOPED_TRACE("case " + std::to_string(k) + " flags " + flags[k]);
    LossScaler s(cases[k].c);
    const auto& steps = want[k];
    EXPECT_EQ(steps.size() == 300 && !steps.back().is_string(), cases[k].to_the_end);
    for (size_t i = 0; i < steps.size(); ++i) {
      const bool overflow = flags[k][i] == 'o';
      if (steps[i].is_string()) {
        EXPECT_NE(testing::error_of<Error>([&] { s.update(overflow); }), "(no error)")
            << "DeepSpeed stopped at step " << i;
        ++raised;
        break;
      }
      const double before = s.scale();
      const int hysteresis_before = s.hysteresis_left();
      s.update(overflow);
      ASSERT_EQ(s.scale(), steps[i][0].get<double>()) << "step " << i;
      ASSERT_EQ(s.hysteresis_left(), steps[i][1].get<int>()) << "step " << i;
      grew += s.scale() > before;
      absorbed += overflow && s.scale() == before && s.hysteresis_left() < hysteresis_before;
    }
  }
  // The sequences exercise every part of the rule.
  EXPECT_GE(raised, 3);
  EXPECT_GE(grew, 10);
  EXPECT_GE(absorbed, 10);
}

}  // namespace
}  // namespace dtorch::train
