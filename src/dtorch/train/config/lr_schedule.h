// Learning-rate schedules for `dtorch train --lr-schedule`: the learning rate of every
// optimizer step as a pure function of the step, so that a resumed run, which knows only the
// step it stopped at and the schedule saved in its checkpoint, continues the curve exactly.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>

#include "dtorch/core/enum_names.h"

namespace dtorch::train {
inline namespace config {

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
//
// DeepSpeed's four schedulers (scheduler.type in a --deepspeed-config file) are kinds of their
// own, named as DeepSpeed names them, because their curves differ from the above in ways a
// user moving a ds_config.json would notice: WarmupLR, WarmupDecayLR and WarmupCosineLR warm
// up logarithmically by default (lr x log(i+1)/log(W)), from warmup_min_lr (a ratio of lr for
// WarmupCosineLR), and OneCycle is a triangle (optionally a staircase) followed by 1/(1+rt)
// decay. DeepSpeed sets the rate of optimizer step s from its scheduler's iteration i = s - 1
// (the engine steps the scheduler after the optimizer; at i = -1 the constructor's rate:
// warmup_min_lr, 0 for WarmupCosineLR, cycle_min_lr for OneCycle). The formulas are those of
// deepspeed/runtime/lr_schedules.py, and the test compares every step with DeepSpeed's own
// classes. Their lr is the peak: warmup_max_lr, the optimizer's lr (WarmupCosineLR), or
// cycle_max_lr.

/// DeepSpeed's scheduler parameters, with DeepSpeed's names and defaults (kinds WarmupLR,
/// WarmupDecayLR, WarmupCosineLR, OneCycle; their warmup_num_steps is warmup_steps).
struct DeepSpeedScheduleParams {
  std::string warmup_type = "log";  ///< log | linear (the three Warmup* kinds)
  double warmup_min_lr = 0;         ///< WarmupLR, WarmupDecayLR: where the warm-up starts
  int64_t total_num_steps = 0;      ///< WarmupDecayLR, WarmupCosineLR: where the decay ends
  double warmup_min_ratio = 0;      ///< WarmupCosineLR: the warm-up's start, a ratio of lr
  double cos_min_ratio = 1e-4;      ///< WarmupCosineLR: the decay's end, a ratio of lr
  double cycle_min_lr = 0;          ///< OneCycle: the cycle's low (its high is lr)
  double decay_lr_rate = 0;         ///< OneCycle: after the cycle, cycle_min_lr / (1 + rate t)
  double cycle_first_step_size = 2000;
  double cycle_second_step_size = -1;     ///< < 0: cycle_first_step_size
  int64_t cycle_first_stair_count = 0;    ///< > 0: the rise in this many stairs
  int64_t cycle_second_stair_count = -1;  ///< < 0: cycle_first_stair_count
  double decay_step_size = 0;             ///< 0: no decay after the cycle
};

/// constant | warmup-linear | warmup-cosine | onecycle, or DeepSpeed's WarmupLR |
/// WarmupDecayLR | WarmupCosineLR | OneCycle (named as DeepSpeed names them).
enum class LrScheduleKind {
  Constant,
  WarmupLinear,
  WarmupCosine,
  OneCycle,
  DeepSpeedWarmupLR,
  DeepSpeedWarmupDecayLR,
  DeepSpeedWarmupCosineLR,
  DeepSpeedOneCycle,
};
const NameTable<LrScheduleKind>& names(LrScheduleKind);

struct LrScheduleConfig {
  LrScheduleKind kind = LrScheduleKind::Constant;
  int64_t warmup_steps = 0;           ///< optimizer steps of warm-up (onecycle: of rising)
  double min_lr = 0;                  ///< where the decay ends
  DeepSpeedScheduleParams deepspeed;  ///< the DeepSpeed kinds' parameters
};

/// True for WarmupLR, WarmupDecayLR, WarmupCosineLR and OneCycle.
bool is_deepspeed_schedule(LrScheduleKind kind);

/// The learning rate of optimizer step `step` of `total_steps`, peak `lr`.
double lr_at(const LrScheduleConfig& c, double lr, int64_t step, int64_t total_steps);

/// Throws ConfigError naming the flag (--lr-schedule, --warmup-steps, --min-lr) and the fix.
/// `total_steps` is the run's optimizer steps (epochs x steps per epoch); 0: not known yet.
void validate(const LrScheduleConfig& c, double lr, int64_t total_steps = 0);

/// "warmup-cosine (100 warm-up steps, 0.001 -> 1e-05 over 2000 steps)".
std::string describe(const LrScheduleConfig& c, double lr, int64_t total_steps);

/// The configuration as checkpoints record it: kind, warmup_steps, min_lr, and for the
/// DeepSpeed kinds their parameters under "deepspeed" (nlohmann's to_json/from_json, so
/// json(c) and j.get<LrScheduleConfig>() work). from_json throws on missing keys.
void to_json(nlohmann::json& j, const LrScheduleConfig& c);
void from_json(const nlohmann::json& j, LrScheduleConfig& c);

}  // namespace config
}  // namespace dtorch::train
