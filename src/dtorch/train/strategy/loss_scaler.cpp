// Loss scaling for fp16 (Note [Loss scaling] in loss_scaler.h): DeepSpeed's dynamic rule, its
// checkpoint state, and the overflow check and unscaling of the gradients.
#include "dtorch/train/strategy/loss_scaler.h"

#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <utility>

#include "dtorch/core/error.h"

namespace dtorch::train {
inline namespace strategy {

LossScaler::LossScaler(const LossScaleConfig& c)
    : config_(c),
      scale_(c.dynamic() ? std::ldexp(1.0, c.initial_scale_power) : c.loss_scale),
      cur_hysteresis_(c.hysteresis) {
  validate(c);
}

// DeepSpeed's DynamicLossScaler.update_scale, statement for statement (Note [Loss scaling]).
bool LossScaler::update(bool overflow) {
  const auto& c = config_;
  if (overflow) {
    if (c.dynamic()) {
      if (c.hysteresis == 1 || cur_hysteresis_ == 1) {
        // DeepSpeed raises when the scale equals the floor; below it (a run resumed with a
        // higher --min-loss-scale) is the same case.
        DTORCH_CHECK(scale_ > c.min_loss_scale, "fp16 gradients overflowed at step ", cur_iter_,
                     " with the loss scale already at its minimum (--min-loss-scale ",
                     c.min_loss_scale,
                     "): they are inf or nan whatever the scale. Likely causes: 1) the run "
                     "diverged (lower --lr, set --clip-grad-norm); 2) inf or nan in the data; "
                     "3) a model that overflows fp16 in forward (train with --precision bf16). "
                     "A lower --min-loss-scale only helps when the gradients are merely large");
        scale_ = std::max(scale_ / 2, c.min_loss_scale);
      } else {
        --cur_hysteresis_;
      }
    }
    last_overflow_iter_ = cur_iter_;
    ++skipped_;
  } else if (c.dynamic()) {
    if (c.consecutive_hysteresis) cur_hysteresis_ = c.hysteresis;
    const int64_t stable_interval = cur_iter_ - last_overflow_iter_ - 1;
    if (stable_interval > 0 && stable_interval % c.loss_scale_window == 0) {
      if (!c.consecutive_hysteresis) cur_hysteresis_ = c.hysteresis;
      scale_ *= 2;
    }
  }
  ++cur_iter_;
  return !overflow;
}

nlohmann::json LossScaler::to_json() const {
  return {{"scale", scale_},
          {"cur_iter", cur_iter_},
          {"last_overflow_iter", last_overflow_iter_},
          {"cur_hysteresis", cur_hysteresis_},
          {"skipped", skipped_}};
}

namespace {

// The whole number `state[key]` in [lo, hi]; CheckpointError naming the field otherwise.
int64_t loss_scaler_field(const nlohmann::json& state, const char* key, int64_t lo, int64_t hi) {
  auto it = state.find(key);
  DTORCH_CHECK_T(CheckpointError, it != state.end(), "the checkpoint's loss scaler state has no '",
                 key, "' (got ", state.dump(),
                 "); the file is damaged or was not written by dtorch: resume from another "
                 "checkpoint");
  DTORCH_CHECK_T(CheckpointError,
                 it->is_number_integer() && it->get<int64_t>() >= lo && it->get<int64_t>() <= hi,
                 "the checkpoint's loss scaler state has '", key, "' ", it->dump(),
                 ", which must be a whole number from ", lo, " to ", hi,
                 "; the file is damaged: resume from another checkpoint");
  return it->get<int64_t>();
}

}  // namespace

LossScaler LossScaler::from_json(const LossScaleConfig& c, const nlohmann::json& state) {
  LossScaler s(c);
  DTORCH_CHECK_T(CheckpointError, state.is_object(),
                 "the checkpoint's loss scaler state must be a JSON object (got ", state.dump(),
                 "); the file is damaged: resume from another checkpoint");
  auto scale = state.find("scale");
  DTORCH_CHECK_T(CheckpointError, scale != state.end(),
                 "the checkpoint's loss scaler state has no 'scale' (got ", state.dump(),
                 "); the file is damaged or was not written by dtorch: resume from another "
                 "checkpoint");
  DTORCH_CHECK_T(
      CheckpointError,
      scale->is_number() && std::isfinite(scale->get<double>()) && scale->get<double>() > 0,
      "the checkpoint's loss scaler state has 'scale' ", scale->dump(),
      ", which must be a number above 0; the file is damaged: resume from another "
      "checkpoint");
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  s.cur_iter_ = loss_scaler_field(state, "cur_iter", 0, kMax);
  s.last_overflow_iter_ = loss_scaler_field(state, "last_overflow_iter", -1, s.cur_iter_ - 1);
  s.cur_hysteresis_ = static_cast<int>(
      loss_scaler_field(state, "cur_hysteresis", 1, std::numeric_limits<int>::max()));
  s.skipped_ = loss_scaler_field(state, "skipped", 0, s.cur_iter_);
  if (c.dynamic()) s.scale_ = scale->get<double>();
  return s;
}

at::Tensor LossScaler::state_tensor(at::Device device) const {
  return at::tensor(
             {scale_, static_cast<double>(cur_iter_), static_cast<double>(last_overflow_iter_),
              static_cast<double>(cur_hysteresis_), static_cast<double>(skipped_)},
             at::kDouble)
      .to(device);
}

bool LossScaler::same_state(const at::Tensor& state) const {
  return state.numel() == 5 &&
         at::equal(state.to(at::kDouble).reshape({5}), state_tensor(at::kCPU));
}

void update_on_device(const LossScaleConfig& c, at::Tensor& state, const at::Tensor& overflow) {
  at::NoGradGuard no_grad;
  const at::Tensor o = overflow.reshape({}).to(state.device()) != 0;
  const at::Tensor scale = state[0], iter = state[1], last = state[2], hyst = state[3];
  const auto number = [&](double v) { return at::scalar_tensor(v, state.options()); };
  at::Tensor new_scale = scale, new_hyst = hyst;
  if (c.dynamic()) {
    // An overflow halves the scale once the hysteresis is used up, else uses one of it up.
    const at::Tensor halve = c.hysteresis == 1 ? at::ones_like(o) : hyst == 1;
    const at::Tensor halved = at::clamp_min(scale / 2, c.min_loss_scale);
    // A clean step doubles it after every loss_scale_window stable steps (plus one).
    const at::Tensor stable = iter - last - 1;
    const at::Tensor grow = (stable > 0) & (at::fmod(stable, c.loss_scale_window) == 0);
    const at::Tensor refilled = number(c.hysteresis);
    const at::Tensor clean_hyst =
        c.consecutive_hysteresis ? refilled : at::where(grow, refilled, hyst);
    new_scale = at::where(o, at::where(halve, halved, scale), at::where(grow, scale * 2, scale));
    new_hyst = at::where(o, at::where(halve, hyst, hyst - 1), clean_hyst);
  }
  state.copy_(at::stack({new_scale, iter + 1, at::where(o, iter, last), new_hyst,
                         state[4] + o.to(state.scalar_type())}));
}

at::Tensor non_finite_flag(const std::vector<at::Tensor>& tensors, at::Device device) {
  // Per device and dtype, the largest and smallest element of each tensor: max is nan when
  // any element is and +inf when one is, min is -inf when one is. Reductions leave nothing the
  // size of a tensor behind (isinf | isnan would make two masks per tensor, DeepSpeed's reason
  // too). (at::_amp_foreach_non_finite_check_and_unscale_ would fuse this with the unscaling on
  // CUDA, but LibTorch 1.13 has no CPU kernel for it.)
  std::map<std::pair<std::string, at::ScalarType>, std::vector<at::Tensor>> extremes;
  for (at::Tensor t : tensors) {
    if (!t.defined()) continue;
    if (t.is_sparse()) t = t._values();  // the implicit zeros are finite
    if (t.is_complex()) t = at::view_as_real(t);
    if (!at::isFloatingType(t.scalar_type()) || t.numel() == 0) continue;  // integers are finite
    auto& v = extremes[{t.device().str(), t.scalar_type()}];
    v.push_back(t.max());
    v.push_back(t.min());
  }
  at::Tensor flag = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device));
  for (auto& [key, v] : extremes) {
    const at::Tensor bad = at::isfinite(at::stack(v)).all().logical_not().to(at::kFloat);
    flag = at::maximum(flag, bad.to(device).reshape({1}));
  }
  return flag;
}

void unscale(std::vector<at::Tensor>& tensors, const at::Tensor& inv_scale) {
  // One multi-tensor kernel per dtype where the LibTorch has the tensor overload (2.1); a
  // loop of mul_ before.
  // Per device too: ZeRO's shards may live on the host while the scale is on the GPU (Note
  // [State on the host]).
  std::map<std::pair<std::string, at::ScalarType>, std::vector<at::Tensor>> by_dtype;
  for (const auto& t : tensors)
    if (t.defined()) by_dtype[{t.device().str(), t.scalar_type()}].push_back(t);
  for (auto& [key, group] : by_dtype) {
    const at::Tensor factor = inv_scale.to(group.front().device());
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
    at::_foreach_mul_(group, factor.to(key.second == at::kDouble ? at::kDouble : at::kFloat));
#else
    for (auto& t : group)
      t.mul_(factor);
#endif
  }
}

}  // namespace strategy
}  // namespace dtorch::train
