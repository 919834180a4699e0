// Loss scaling for fp16 training, as DeepSpeed's "fp16" block defines it: the configuration,
// the dynamic scale's rule (DeepSpeed's DynamicLossScaler) and the checks of the gradients it
// needs. Pure: the caller runs backward, reduces the overflow flag over ranks and steps.
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <vector>

#include "dtorch/train/config/loss_scale_config.h"

namespace dtorch::train {
inline namespace strategy {

// Note [Loss scaling]
// Why: fp16 keeps 5 exponent bits. Its smallest normal number is 6.1e-5 (subnormals reach
// 6e-8), and many gradients, of activations above all, lie below that: computed in fp16 they
// become zero and the model learns less or not at all. Backward of loss x S (S a power of two)
// shifts every gradient up by log2(S) binades, where fp16 holds them; dividing by S afterwards (in
// fp32) gives back the true gradient. Too large an S overflows instead: some gradient becomes inf
// or nan. bf16 has fp32's exponent range and needs none of this.
//
// The rule (DeepSpeed's DynamicLossScaler.update_scale, deepspeed 0.19.8; its ZeRO optimizers
// use it): start at 2^initial_scale_power. On an overflow the step is skipped and, once
// `hysteresis` overflows have been absorbed, the scale halves, never below min_loss_scale;
// the overflow's step is remembered (last_overflow_iter). A step without overflow doubles the
// scale when (cur_iter - last_overflow_iter - 1) is a positive multiple of loss_scale_window, so
// the first doubling comes after loss_scale_window + 1 clean steps (DeepSpeed before 0.17.1,
// PR #6976, tested (cur_iter - last_overflow_iter) % window == 0, one step earlier; dtorch
// follows the release it is compared with, tests/train/strategy/loss_scaler_test.cpp). Hysteresis:
// cur_hysteresis starts at `hysteresis`; an overflow with cur_hysteresis > 1 only lowers it by one;
// it is refilled when the scale doubles, or with consecutive_hysteresis after every clean step
// (then only `hysteresis` overflows in a row halve the scale). Once cur_hysteresis reached 1
// without a refill, every further overflow halves the scale. DeepSpeed's ZeRO-less FP16_Optimizer
// has a rule of its own without hysteresis; dtorch uses DynamicLossScaler's for every strategy. At
// the floor: an overflow that would halve a scale already at min_loss_scale is an error in
// DeepSpeed ("Current loss scale already at minimum ... Exiting run") and in dtorch: gradients
// that overflow at the smallest scale allowed are inf or nan whatever the scale (a diverged run,
// a nan in the data), and skipping every step from then on would train nothing while the run
// looks alive. A static scale (loss_scale > 0) never changes; an overflow still skips the step,
// as DeepSpeed's ZeRO optimizers skip it.
//
// Ranks: each rank sees only its own gradients (or its shard of them), so its flag is local.
// The caller reduces it with MAX over every rank whose gradients make up the step (the
// data-parallel group, and the tensor- and pipeline-parallel groups whose shards it updates)
// before update(): one rank skipping while another steps would leave their weights apart, and
// all ranks must change the scale alike to stay in step.
//
// A step: forward under fp16 autocast; backward of loss x scale(); non_finite_flag on the
// gradients (after their reduction across ranks, which sums scaled values); the flag reduced
// with MAX; unscale by 1 / the scale used in backward (before update(), which may double it);
// update(flag); clip the unscaled gradients; step unless the flag is set, then clear the
// gradients (a skipped step does not advance the learning-rate schedule, as in DeepSpeed).
// Checkpoints keep to_json() (scale and counters), so a resumed run continues with the
// same scale, window and hysteresis instead of searching for a scale again from 2^16; the
// configuration comes from the resumed run's flags. Metrics report the scale and the number of
// skipped steps (skipped()), as DeepSpeed's engine reports skipped_steps.
//
// On the device: reading the flag on the host would drain a GPU's queue every step (Note [No
// host sync in a step] in step_stats.h), so a step decides there: the scale backward multiplies
// by, the flag (non_finite_flag, reduced with MAX by the collectives, which stay on the device),
// the unscaling and the rule itself (update_on_device, on state_tensor()'s five numbers) are
// tensors on the device, and the optimizer takes the flag and skips its own update (Note [Steps
// the device skips] in optim/fused.h). The host learns each step's flag a step later, when the
// device finished it long ago, and replays it through update(), the same rule: the copy that
// checkpoints, metrics and the learning-rate schedule read, the one that raises the error at the
// floor, and a check of the device's arithmetic (both states must agree). The schedule reads the
// count of skipped steps just before the next optimizer step, so it stays exact.

/// The scale of one run: dynamic (Note [Loss scaling]) or static. The same sequence of
/// update() calls on every rank keeps every rank's scale the same.
class LossScaler {
 public:
  /// Validates `c`; the scale starts at 2^initial_scale_power, or loss_scale when static.
  explicit LossScaler(const LossScaleConfig& c);

  const LossScaleConfig& config() const { return config_; }
  /// What to multiply the loss by before backward.
  double scale() const { return scale_; }
  /// After a step's overflow check (the flag reduced over ranks): updates the scale and
  /// returns whether the optimizer step is taken (false on overflow). Throws dtorch::Error
  /// when an overflow finds the dynamic scale at min_loss_scale with no hysteresis left.
  bool update(bool overflow);

  /// Steps seen (update() calls), and those skipped for an overflow.
  int64_t steps() const { return cur_iter_; }
  int64_t skipped() const { return skipped_; }
  /// Overflows still absorbed before the scale halves.
  int hysteresis_left() const { return cur_hysteresis_; }

  /// The state as the device keeps it (Note [Loss scaling], "On the device"): float64
  /// {scale, cur_iter, last_overflow_iter, cur_hysteresis, skipped}.
  at::Tensor state_tensor(at::Device device) const;
  /// Whether a state_tensor() on the CPU holds this scaler's state.
  bool same_state(const at::Tensor& state) const;

  /// The state a checkpoint keeps: {"scale", "cur_iter", "last_overflow_iter",
  /// "cur_hysteresis", "skipped"}.
  nlohmann::json to_json() const;
  /// A scaler of configuration `c` continuing from `state` (to_json()'s); under a static `c`
  /// the scale is c.loss_scale whatever the state says. CheckpointError naming the field when
  /// one is missing, of the wrong type or out of range.
  static LossScaler from_json(const LossScaleConfig& c, const nlohmann::json& state);

 private:
  LossScaleConfig config_;
  double scale_;
  int64_t cur_iter_ = 0;
  int64_t last_overflow_iter_ = -1;
  int cur_hysteresis_;
  int64_t skipped_ = 0;
};

/// LossScaler::update's rule applied to `state` (a state_tensor()) in place on its device, with
/// `overflow` a float [1] there, nonzero for an overflow: nothing is read on the host. At the
/// floor the scale stays at min_loss_scale; the host's update() raises the error.
void update_on_device(const LossScaleConfig& c, at::Tensor& state, const at::Tensor& overflow);

/// A float [1] on `device`: 1 when any element of any defined tensor is inf, -inf or nan, else
/// 0. Two reductions per tensor (max and min, which nan and the infinities survive; nothing the
/// size of a tensor is allocated), all computed on the tensors' devices; nothing is read.
at::Tensor non_finite_flag(const std::vector<at::Tensor>& tensors, at::Device device);

/// Multiplies every defined tensor by `inv_scale` (a number in a tensor on their device: 1 / the
/// scale backward used) in place.
void unscale(std::vector<at::Tensor>& tensors, const at::Tensor& inv_scale);

}  // namespace strategy
}  // namespace dtorch::train
