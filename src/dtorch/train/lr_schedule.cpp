// The learning-rate schedules of Note [Learning-rate schedules] (lr_schedule.h).
#include "dtorch/train/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "dtorch/core/error.h"

namespace dtorch::train {
namespace {

constexpr double kPi = 3.14159265358979323846;
// OneCycleLR's defaults: it starts at max_lr / div_factor and ends at that / final_div_factor.
constexpr double kDivFactor = 25.0, kFinalDivFactor = 1e4, kPctStart = 0.3;

// OneCycleLR's _annealing_cos: from `start` at pct 0 to `end` at pct 1.
double cosine(double start, double end, double pct) {
  return end + (start - end) / 2.0 * (std::cos(kPi * pct) + 1.0);
}

// The last step of onecycle's rising phase, as OneCycleLR computes it (a float).
double onecycle_peak_step(const LrScheduleConfig& c, int64_t total) {
  const double rise = c.warmup_steps > 0 ? static_cast<double>(c.warmup_steps)
                                         : kPctStart * static_cast<double>(total);
  return rise - 1.0;
}

double onecycle(const LrScheduleConfig& c, double lr, int64_t step, int64_t total) {
  const double initial = lr / kDivFactor;
  const double final_lr = c.min_lr > 0 ? c.min_lr : initial / kFinalDivFactor;
  const double peak = onecycle_peak_step(c, total), end = static_cast<double>(total - 1);
  const double s = std::min(static_cast<double>(step), end);
  if (s <= peak) return cosine(initial, lr, s / peak);
  return cosine(lr, final_lr, (s - peak) / (end - peak));
}

}  // namespace

double lr_at(const LrScheduleConfig& c, double lr, int64_t step, int64_t total) {
  if (c.kind == "onecycle") return onecycle(c, lr, step, total);
  const int64_t w = c.warmup_steps;
  if (step < w) return lr * static_cast<double>(step + 1) / static_cast<double>(w);
  if (c.kind == "constant") return lr;
  const double pct =
      total > w ? std::min(1.0, static_cast<double>(step - w) / static_cast<double>(total - w))
                : 1.0;
  if (c.kind == "warmup-linear") return lr + (c.min_lr - lr) * pct;
  return cosine(lr, c.min_lr, pct);  // warmup-cosine
}

void validate(const LrScheduleConfig& c, double lr, int64_t total) {
  DTORCH_CHECK_T(ConfigError,
                 c.kind == "constant" || c.kind == "warmup-linear" || c.kind == "warmup-cosine" ||
                     c.kind == "onecycle",
                 "unknown --lr-schedule '", c.kind,
                 "'; use constant, warmup-linear, warmup-cosine or onecycle");
  DTORCH_CHECK_T(ConfigError, c.warmup_steps >= 0, "--warmup-steps must be >= 0 (got ",
                 c.warmup_steps, ")");
  DTORCH_CHECK_T(ConfigError, c.min_lr >= 0 && c.min_lr <= lr, "--min-lr ", c.min_lr,
                 " must lie between 0 and --lr ", lr);
  if (total <= 0) return;
  if (c.kind == "onecycle") {
    const double peak = onecycle_peak_step(c, total);
    DTORCH_CHECK_T(ConfigError,
                   peak > 0 && peak<static_cast<double>(total - 1),
                                    "--lr-schedule onecycle rises for ", c.warmup_steps> 0
                       ? str("--warmup-steps ", c.warmup_steps)
                       : str("30% of the ", total, " steps"),
                   " and must leave at least one step to rise and one to fall of the run's ", total,
                   " optimizer steps; give --warmup-steps between 2 and ", total - 1,
                   " or train more steps (--epochs)");
  } else {
    DTORCH_CHECK_T(ConfigError, c.warmup_steps <= total, "--warmup-steps ", c.warmup_steps,
                   " is longer than the run's ", total,
                   " optimizer steps; give at most that many, or train more steps (--epochs)");
  }
}

std::string describe(const LrScheduleConfig& c, double lr, int64_t total) {
  const std::string warmup = c.warmup_steps > 0 ? str(c.warmup_steps, " warm-up steps, ") : "";
  if (c.kind == "constant") {
    return c.warmup_steps > 0 ? str("constant ", lr, " after ", c.warmup_steps, " warm-up steps")
                              : str("constant ", lr);
  }
  if (c.kind == "onecycle") {
    return str("onecycle (", lr_at(c, lr, 0, total), " -> ", lr, " at step ",
               static_cast<int64_t>(onecycle_peak_step(c, total)), " -> ",
               lr_at(c, lr, total - 1, total), " at step ", total - 1, ")");
  }
  return str(c.kind, " (", warmup, lr, " -> ", c.min_lr, " over ", total, " steps)");
}

}  // namespace dtorch::train
