// The learning-rate schedules of Note [Learning-rate schedules] (lr_schedule.h).
#include "dtorch/train/config/lr_schedule.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

#include "dtorch/core/error.h"

namespace dtorch::train {
inline namespace config {
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

// DeepSpeed's warm-ups run over at least 2 steps (its max(2, warmup_num_steps)).
double deepspeed_warmup_steps(const LrScheduleConfig& c) {
  return static_cast<double>(std::max<int64_t>(2, c.warmup_steps));
}

// DeepSpeed's warm-up fraction at scheduler iteration i (< the warm-up's steps).
double deepspeed_warmup(const DeepSpeedScheduleParams& p, double i, double w) {
  return p.warmup_type == "linear" ? i / w : std::log(i + 1) / std::log(w);
}

// WarmupLR and WarmupDecayLR: warmup_min_lr + (lr - warmup_min_lr) x gamma(i).
double deepspeed_warmup_decay(const LrScheduleConfig& c, double lr, double i) {
  const auto& p = c.deepspeed;
  if (i < 0) return p.warmup_min_lr;
  const double w = deepspeed_warmup_steps(c);
  double gamma = 1.0;
  if (i < w) {
    gamma = deepspeed_warmup(p, i, w);
  } else if (c.kind == LrScheduleKind::DeepSpeedWarmupDecayLR) {
    const double t = static_cast<double>(p.total_num_steps);
    gamma = std::max(0.0, (t - i) / std::max(1.0, t - w));
  }
  return p.warmup_min_lr + (lr - p.warmup_min_lr) * gamma;
}

double deepspeed_warmup_cosine(const LrScheduleConfig& c, double lr, double i) {
  const auto& p = c.deepspeed;
  if (i < 0) return 0.0;
  const double w = deepspeed_warmup_steps(c);
  if (i < w)
    return lr * (p.warmup_min_ratio + deepspeed_warmup(p, i, w) * (1 - p.warmup_min_ratio));
  const double progress =
      std::min(1.0, (i - w + 1) / std::max(1.0, static_cast<double>(p.total_num_steps) - w));
  const double ratio = (1 + std::cos(kPi * progress)) / 2;
  return lr * std::max(0.0, p.cos_min_ratio + (1 - p.cos_min_ratio) * ratio);
}

// DeepSpeed's OneCycle at batch b = i + 1: a triangle from cycle_min_lr up to lr over
// cycle_first_step_size batches and down over cycle_second_step_size (in stairs when a stair
// count is set), then cycle_min_lr / (1 + decay_lr_rate x t / decay_step_size).
double deepspeed_onecycle(const LrScheduleConfig& c, double lr, double i) {
  const auto& p = c.deepspeed;
  const double first = p.cycle_first_step_size;
  const double second = p.cycle_second_step_size < 0 ? first : p.cycle_second_step_size;
  const double total = first + second, ratio = first / total;
  if (i >= total) {
    if (p.decay_step_size == 0 || p.decay_lr_rate == 0) return p.cycle_min_lr;
    return p.cycle_min_lr / (1 + p.decay_lr_rate * ((i - total + 1) / p.decay_step_size));
  }
  const double b = i + 1;
  const double x = 1 + b / total - std::floor(1 + b / total);
  double scale = 0;
  int64_t stairs = 0;
  if (x <= ratio) {
    scale = x / ratio;
    stairs = p.cycle_first_stair_count;
  } else {
    scale = (x - 1) / (ratio - 1);
    stairs =
        p.cycle_second_stair_count < 0 ? p.cycle_first_stair_count : p.cycle_second_stair_count;
  }
  if (stairs > 0) {
    const double at = std::fmod(b, total);
    const double position = at <= first ? at * static_cast<double>(stairs) / first
                                        : (total - at) * static_cast<double>(stairs) / second;
    scale = std::floor(position) / static_cast<double>(stairs);
  }
  return p.cycle_min_lr + (lr - p.cycle_min_lr) * scale;
}

double deepspeed_lr_at(const LrScheduleConfig& c, double lr, int64_t step) {
  const double i = static_cast<double>(step) - 1;  // the scheduler's last_batch_iteration
  if (c.kind == LrScheduleKind::DeepSpeedWarmupCosineLR) return deepspeed_warmup_cosine(c, lr, i);
  if (c.kind == LrScheduleKind::DeepSpeedOneCycle) return deepspeed_onecycle(c, lr, i);
  return deepspeed_warmup_decay(c, lr, i);
}

void validate_deepspeed(const LrScheduleConfig& c, double lr) {
  const auto& p = c.deepspeed;
  const std::string where = str("DeepSpeed scheduler ", name_of(c.kind), ": ");
  DTORCH_CHECK_T(ConfigError, p.warmup_type == "log" || p.warmup_type == "linear", where,
                 "warmup_type '", p.warmup_type, "'; use log or linear");
  DTORCH_CHECK_T(ConfigError, c.warmup_steps >= 1, where,
                 "warmup_num_steps must be a positive integer (got ", c.warmup_steps, ")");
  if (c.kind == LrScheduleKind::DeepSpeedWarmupLR ||
      c.kind == LrScheduleKind::DeepSpeedWarmupDecayLR) {
    DTORCH_CHECK_T(ConfigError, p.warmup_min_lr >= 0 && p.warmup_min_lr <= lr, where,
                   "warmup_min_lr ", p.warmup_min_lr, " must lie between 0 and warmup_max_lr ", lr);
  }
  if (c.kind == LrScheduleKind::DeepSpeedWarmupDecayLR ||
      c.kind == LrScheduleKind::DeepSpeedWarmupCosineLR) {
    DTORCH_CHECK_T(ConfigError, p.total_num_steps >= 1, where,
                   "total_num_steps must be a positive integer (got ", p.total_num_steps, ")");
  }
  if (c.kind == LrScheduleKind::DeepSpeedWarmupCosineLR) {
    DTORCH_CHECK_T(ConfigError, p.warmup_min_ratio >= 0 && p.warmup_min_ratio <= 1, where,
                   "warmup_min_ratio ", p.warmup_min_ratio, " must lie between 0 and 1");
    DTORCH_CHECK_T(ConfigError, p.cos_min_ratio >= 0 && p.cos_min_ratio <= 1, where,
                   "cos_min_ratio ", p.cos_min_ratio, " must lie between 0 and 1");
  }
  if (c.kind == LrScheduleKind::DeepSpeedOneCycle) {
    DTORCH_CHECK_T(ConfigError, p.cycle_first_step_size > 0, where,
                   "cycle_first_step_size must be positive (got ", p.cycle_first_step_size, ")");
    DTORCH_CHECK_T(ConfigError, p.cycle_min_lr >= 0 && p.cycle_min_lr <= lr, where, "cycle_min_lr ",
                   p.cycle_min_lr, " must lie between 0 and cycle_max_lr ", lr);
    DTORCH_CHECK_T(ConfigError, p.decay_lr_rate >= 0 && p.decay_step_size >= 0, where,
                   "decay_lr_rate and decay_step_size must be >= 0");
  }
}

}  // namespace

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(DeepSpeedScheduleParams, warmup_type, warmup_min_lr,
                                   total_num_steps, warmup_min_ratio, cos_min_ratio, cycle_min_lr,
                                   decay_lr_rate, cycle_first_step_size, cycle_second_step_size,
                                   cycle_first_stair_count, cycle_second_stair_count,
                                   decay_step_size)

const NameTable<LrScheduleKind>& names(LrScheduleKind) {
  static const NameTable<LrScheduleKind> n{
      {LrScheduleKind::Constant, "constant"},
      {LrScheduleKind::WarmupLinear, "warmup-linear"},
      {LrScheduleKind::WarmupCosine, "warmup-cosine"},
      {LrScheduleKind::OneCycle, "onecycle"},
      {LrScheduleKind::DeepSpeedWarmupLR, "WarmupLR"},
      {LrScheduleKind::DeepSpeedWarmupDecayLR, "WarmupDecayLR"},
      {LrScheduleKind::DeepSpeedWarmupCosineLR, "WarmupCosineLR"},
      {LrScheduleKind::DeepSpeedOneCycle, "OneCycle"}};
  return n;
}

bool is_deepspeed_schedule(LrScheduleKind kind) {
  return kind == LrScheduleKind::DeepSpeedWarmupLR ||
         kind == LrScheduleKind::DeepSpeedWarmupDecayLR ||
         kind == LrScheduleKind::DeepSpeedWarmupCosineLR ||
         kind == LrScheduleKind::DeepSpeedOneCycle;
}

double lr_at(const LrScheduleConfig& c, double lr, int64_t step, int64_t total) {
  if (is_deepspeed_schedule(c.kind)) return deepspeed_lr_at(c, lr, step);
  if (c.kind == LrScheduleKind::OneCycle) return onecycle(c, lr, step, total);
  const int64_t w = c.warmup_steps;
  if (step < w) return lr * static_cast<double>(step + 1) / static_cast<double>(w);
  if (c.kind == LrScheduleKind::Constant) return lr;
  const double pct =
      total > w ? std::min(1.0, static_cast<double>(step - w) / static_cast<double>(total - w))
                : 1.0;
  if (c.kind == LrScheduleKind::WarmupLinear) return lr + (c.min_lr - lr) * pct;
  return cosine(lr, c.min_lr, pct);  // warmup-cosine
}

void validate(const LrScheduleConfig& c, double lr, int64_t total) {
  if (is_deepspeed_schedule(c.kind)) return validate_deepspeed(c, lr);
  DTORCH_CHECK_T(ConfigError, c.warmup_steps >= 0, "--warmup-steps must be >= 0 (got ",
                 c.warmup_steps, ")");
  DTORCH_CHECK_T(ConfigError, c.min_lr >= 0 && c.min_lr <= lr, "--min-lr ", c.min_lr,
                 " must lie between 0 and --lr ", lr);
  if (total <= 0) return;
  if (c.kind == LrScheduleKind::OneCycle) {
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
  if (is_deepspeed_schedule(c.kind)) {
    return str("DeepSpeed ", name_of(c.kind), " (", lr_at(c, lr, 0, total), " at step 0, ",
               lr_at(c, lr, c.warmup_steps, total), " at step ", c.warmup_steps, ", ",
               lr_at(c, lr, total - 1, total), " at step ", total - 1, ")");
  }
  const std::string warmup = c.warmup_steps > 0 ? str(c.warmup_steps, " warm-up steps, ") : "";
  if (c.kind == LrScheduleKind::Constant) {
    return c.warmup_steps > 0 ? str("constant ", lr, " after ", c.warmup_steps, " warm-up steps")
                              : str("constant ", lr);
  }
  if (c.kind == LrScheduleKind::OneCycle) {
    return str("onecycle (", lr_at(c, lr, 0, total), " -> ", lr, " at step ",
               static_cast<int64_t>(onecycle_peak_step(c, total)), " -> ",
               lr_at(c, lr, total - 1, total), " at step ", total - 1, ")");
  }
  return str(name_of(c.kind), " (", warmup, lr, " -> ", c.min_lr, " over ", total, " steps)");
}

void to_json(nlohmann::json& j, const LrScheduleConfig& c) {
  j = {{"kind", name_of(c.kind)}, {"warmup_steps", c.warmup_steps}, {"min_lr", c.min_lr}};
  if (!is_deepspeed_schedule(c.kind)) return;
  j["deepspeed"] = c.deepspeed;
}

void from_json(const nlohmann::json& j, LrScheduleConfig& c) {
  c = {};
  const std::string kind = j.at("kind").get<std::string>();
  const auto known = value_named<LrScheduleKind>(kind);
  DTORCH_CHECK_T(ConfigError, known, "unknown learning-rate schedule '", kind, "'; dtorch knows ",
                 listed<LrScheduleKind>());
  c.kind = *known;
  j.at("warmup_steps").get_to(c.warmup_steps);
  j.at("min_lr").get_to(c.min_lr);
  if (!is_deepspeed_schedule(c.kind)) return;
  j.at("deepspeed").get_to(c.deepspeed);
}

}  // namespace config
}  // namespace dtorch::train
