// fp16's loss scaling as DeepSpeed's "fp16" block sets it: a plain struct that the precision's
// settings hold and the scaler (train/strategy/loss_scaler.h, Note [Loss scaling]) follows.
#pragma once

namespace dtorch::train {
inline namespace config {

/// The "fp16" block of a DeepSpeed configuration (its keys and defaults) as flags.
struct LossScaleConfig {
  /// --loss-scale: 0 scales dynamically; a value > 0 is a static scale, used throughout.
  double loss_scale = 0;
  /// --initial-scale-power: the dynamic scale starts at 2^this.
  int initial_scale_power = 16;
  /// --loss-scale-window: the scale doubles after this many steps without overflow (plus one,
  /// Note [Loss scaling]).
  int loss_scale_window = 1000;
  /// --hysteresis: overflows absorbed before the scale halves (DeepSpeed's delayed_shift).
  int hysteresis = 2;
  /// Whether every step without overflow refills the hysteresis (else only a doubling does).
  bool consecutive_hysteresis = false;
  /// --min-loss-scale: the dynamic scale never halves below this.
  double min_loss_scale = 1;

  bool dynamic() const { return loss_scale == 0; }
};

/// Throws ConfigError naming the flag, the value and the fix.
void validate(const LossScaleConfig& c);

}  // namespace config
}  // namespace dtorch::train
