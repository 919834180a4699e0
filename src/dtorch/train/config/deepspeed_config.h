// DeepSpeed configuration files for `dtorch train --deepspeed-config ds_config.json`: the keys
// that mean something in dtorch become TrainConfig fields, so the ds_config.json a user brings
// from the tutorials trains as it did under DeepSpeed. Reading and applying are pure (text in,
// settings and warnings out); the command line says which flags were given, and those win.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "dtorch/train/config/lr_schedule.h"
#include "dtorch/train/config/strategy_config.h"

namespace dtorch::train {
inline namespace config {

struct TrainConfig;

// Note [DeepSpeed configuration]
// Keys and what they become (flags in parentheses override them):
//   train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps
//       DeepSpeed's rule: train_batch_size = micro x accumulation x data-parallel size; any
//       two give the third (integer division, as DeepSpeed), all three must agree
//       (--batch-size is the micro batch, --accum-steps the accumulation). Under --pp the
//       accumulation steps are the pipeline's micro-batches (--microbatches), as in DeepSpeed's
//       pipeline engine, and --batch-size is a rank's whole batch (Note [Micro-batches]).
//   zero_optimization.stage 0-3      --strategy ddp | zero1 | zero2 | zero3
//   zero_optimization.reduce_bucket_size (elements; fp32: 4 bytes each)   --bucket-cap-mb
//   zero_optimization.offload_optimizer: device (none | cpu | nvme) --offload-optimizer,
//       nvme_path --offload-dir, buffer_count --offload-buffers; pin_memory changes nothing
//       (a run that offloads computes on the CPU); fast_init, pipeline_read, pipeline_write
//       and ratio are warnings (dtorch always reads ahead and writes behind, the whole state)
//   zero_optimization.offload_param: device --offload-params, nvme_path --offload-dir (one
//       folder for both: two different paths are an error); buffer_count, buffer_size,
//       max_in_cpu and pin_memory change nothing (the kernel pages the parameters, Note
//       [Parameters on disk])
//   zero_optimization.overlap_comm, contiguous_gradients, reduce_scatter,
//       allgather_partitions: what dtorch always does; false is a warning
//   bf16.enabled (or bfloat16)       --precision bf16
//   fp16.enabled true                --precision fp16 (needs CUDA); with bf16 too, an error as
//       in DeepSpeed. Its loss scaling (Note [Loss scaling]): loss_scale --loss-scale,
//       initial_scale_power --initial-scale-power, loss_scale_window --loss-scale-window,
//       hysteresis --hysteresis, consecutive_hysteresis --consecutive-hysteresis,
//       min_loss_scale --min-loss-scale; auto_cast changes nothing (forward runs under
//       autocast); a disabled block is read for typos only, as DeepSpeed uses none of it.
//   communication_data_type          --reduce-dtype (fp32 | bf16)
//   gradient_clipping                --clip-grad-norm
//   optimizer {type, params}         --optimizer, --lr, --betas, --eps, --weight-decay,
//       --momentum. DeepSpeed's "Adam" is AdamW unless params.adam_w_mode is false (its
//       engine's rule); unset params take DeepSpeed's defaults (lr 1e-3, weight decay 0,
//       momentum 0), not dtorch's.
//   scheduler {type, params}         WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle as
//       kinds of train/config/lr_schedule.h with DeepSpeed's curves; --lr-schedule, --warmup-steps
//       or
//       --min-lr replace it; --lr replaces its peak (warmup_max_lr, cycle_max_lr).
//   steps_per_print                  --print-every
//   wall_clock_breakdown             --phase-times
//   tensorboard {enabled, output_path, job_name}   --tensorboard output_path/job_name (as
//       DeepSpeed joins them; job_name defaults to DeepSpeedJobName)
// A value "auto" (Hugging Face's placeholder) counts as absent. Any other key DeepSpeed knows
// is a warning naming it (dtorch ignores it); a key DeepSpeed does not know is an error naming
// the nearest known one. Syntax errors name the line and column, as do duplicate keys (which
// DeepSpeed also rejects).

/// What a DeepSpeed configuration file says, in dtorch's terms; unset: the file is silent.
struct DeepSpeedSettings {
  std::optional<int64_t> train_batch_size;
  std::optional<int64_t> micro_batch_size;  ///< train_micro_batch_size_per_gpu
  std::optional<int64_t> accum_steps;       ///< gradient_accumulation_steps
  std::optional<StrategyKind> strategy;
  std::optional<double> bucket_cap_mb;
  std::optional<OffloadDevice> offload_optimizer;  ///< zero_optimization.offload_optimizer.device
  std::optional<std::string> offload_dir;          ///< its nvme_path
  std::optional<int> offload_buffers;              ///< its buffer_count
  std::optional<OffloadDevice> offload_params;     ///< zero_optimization.offload_param.device
  /// zero_optimization.zero_hpz_partition_size: the ranks a shard group holds (--dp-replicate
  /// is the data-parallel ranks over it; Note [Hybrid sharding]).
  std::optional<int64_t> hpz_partition_size;
  std::optional<Precision> precision;
  std::optional<ReduceDtype> reduce_dtype;
  std::optional<double> clip_grad_norm;
  std::optional<OptimizerKind> optimizer;
  std::optional<double> lr;  ///< the optimizer's
  std::optional<double> momentum;
  std::optional<double> weight_decay;
  std::optional<std::vector<double>> betas;
  std::optional<double> eps;
  std::optional<LrScheduleConfig> lr_schedule;
  std::optional<double> schedule_peak_lr;  ///< warmup_max_lr or cycle_max_lr
  std::optional<int64_t> print_every;      ///< steps_per_print
  std::optional<bool> phase_times;         ///< wall_clock_breakdown
  std::optional<std::string> tensorboard;  ///< the folder, when tensorboard.enabled
  /// fp16's loss scaling (fp16.enabled true), each LossScaleConfig's field of that name.
  std::optional<double> loss_scale;
  std::optional<int> initial_scale_power;
  std::optional<int> loss_scale_window;
  std::optional<int> hysteresis;
  std::optional<bool> consecutive_hysteresis;
  std::optional<double> min_loss_scale;
  /// Keys dtorch reads but ignores, each with the reason, for the log.
  std::vector<std::string> warnings;
};

/// Parses the text of a configuration file; `name` (the path) starts every error message.
/// Throws ConfigError for bad JSON (line and column), unknown keys (with the nearest known
/// key), bad types and bad values (with the key's path and what it accepts).
DeepSpeedSettings parse_deepspeed_config(const std::string& text, const std::string& name);

/// Reads and parses the file at `path` (ConfigError when it cannot be read).
DeepSpeedSettings read_deepspeed_config(const std::string& path);

/// Sets the fields of `c` the file gives, except those whose flags are in `flags_given`
/// ("--lr", ...). `world_size` is the job's rank count (the data-parallel size is that over
/// c.tp x c.pp). Returns lines for the log: which flags replaced which keys.
std::vector<std::string> apply_deepspeed_config(const DeepSpeedSettings& ds,
                                                const std::set<std::string>& flags_given,
                                                int world_size, TrainConfig& c);

}  // namespace config
}  // namespace dtorch::train
