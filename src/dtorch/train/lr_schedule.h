// Learning-rate schedules for `dtorch train --lr-schedule`: the learning rate of every
// optimizer step as a pure function of the step, so that a resumed run, which knows only the
// step it stopped at and the schedule saved in its checkpoint, continues the curve exactly.
#pragma once

#include <cstdint>
#include <string>

namespace dtorch::train {

// Note [Learning-rate schedules]
// Step s (0-based, counting optimizer steps over the whole run) of T steps, peak rate lr,
// W warm-up steps:
//   constant       lr, after a linear warm-up lr x (s+1)/W when W > 0
//   warmup-linear  the warm-up, then a straight line from lr at s = W to min_lr at s = T
//   warmup-cosine  the warm-up, then half a cosine from lr at s = W to min_lr at s = T
//   onecycle       PyTorch's OneCycleLR (cosine, two phases): from lr/25 up to lr at step W-1
//                  (W: 30% of T when 0), then down to min_lr at step T-1 (min_lr 0: lr/25e4)
// The warm-up and the decays are those of torch.optim.lr_scheduler's LinearLR,
// CosineAnnealingLR and OneCycleLR with the same numbers (the test compares them). Past T
// (a run resumed with more epochs) the rate stays where the schedule ended.

struct LrScheduleConfig {
  std::string kind = "constant";  ///< constant | warmup-linear | warmup-cosine | onecycle
  int64_t warmup_steps = 0;       ///< optimizer steps of warm-up (onecycle: of rising)
  double min_lr = 0;              ///< where the decay ends
};

/// The learning rate of optimizer step `step` of `total_steps`, peak `lr`.
double lr_at(const LrScheduleConfig& c, double lr, int64_t step, int64_t total_steps);

/// Throws ConfigError naming the flag (--lr-schedule, --warmup-steps, --min-lr) and the fix.
/// `total_steps` is the run's optimizer steps (epochs x steps per epoch); 0: not known yet.
void validate(const LrScheduleConfig& c, double lr, int64_t total_steps = 0);

/// "warmup-cosine (100 warm-up steps, 0.001 -> 1e-05 over 2000 steps)".
std::string describe(const LrScheduleConfig& c, double lr, int64_t total_steps);

}  // namespace dtorch::train
