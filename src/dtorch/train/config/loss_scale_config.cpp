// Loss scaling's settings (loss_scale_config.h): their validation, in DeepSpeed's terms.
#include "dtorch/train/config/loss_scale_config.h"

#include <cmath>

#include "dtorch/core/error.h"

namespace dtorch::train {
inline namespace config {

void validate(const LossScaleConfig& c) {
  DTORCH_CHECK_T(ConfigError, std::isfinite(c.loss_scale) && c.loss_scale >= 0, "--loss-scale ",
                 c.loss_scale,
                 ": give 0 for dynamic loss scaling (DeepSpeed's default) or a static scale > 0, "
                 "such as 1024");
  if (!c.dynamic()) return;  // the rest only steers a dynamic scale, as in DeepSpeed
  DTORCH_CHECK_T(ConfigError, c.initial_scale_power >= 0 && c.initial_scale_power <= 64,
                 "--initial-scale-power ", c.initial_scale_power,
                 ": the dynamic scale starts at 2^this; give a power from 0 to 64 (DeepSpeed's "
                 "default: 16)");
  DTORCH_CHECK_T(ConfigError, c.loss_scale_window >= 1, "--loss-scale-window ", c.loss_scale_window,
                 ": the steps without overflow before the scale doubles; give 1 or more "
                 "(DeepSpeed's default: 1000)");
  DTORCH_CHECK_T(ConfigError, c.hysteresis >= 1, "--hysteresis ", c.hysteresis,
                 ": the overflows absorbed before the scale halves; give 1 or more (1 halves it "
                 "at every overflow; DeepSpeed's default: 2)");
  DTORCH_CHECK_T(ConfigError, std::isfinite(c.min_loss_scale) && c.min_loss_scale > 0,
                 "--min-loss-scale ", c.min_loss_scale,
                 ": the floor of the dynamic scale must be above 0 (DeepSpeed's default: 1)");
  const double initial = std::ldexp(1.0, c.initial_scale_power);
  DTORCH_CHECK_T(ConfigError, c.min_loss_scale <= initial, "--min-loss-scale ", c.min_loss_scale,
                 " is above the initial scale 2^", c.initial_scale_power, " = ", initial,
                 "; lower --min-loss-scale or raise --initial-scale-power");
}

}  // namespace config
}  // namespace dtorch::train
