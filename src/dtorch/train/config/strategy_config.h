// A strategy's settings: DDP or a ZeRO stage, its optimizer, its precision and loss scaling,
// DDP's buckets and how checkpoints are laid out. Plain structs that a run's configuration
// holds and make_strategy (train/strategy/strategy.h) takes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dtorch/core/device.h"
#include "dtorch/core/enum_names.h"
#include "dtorch/models/image_input.h"
#include "dtorch/parallel/ddp/options.h"
#include "dtorch/train/config/loss_scale_config.h"

namespace dtorch::train {
inline namespace config {

// The closed sets of a strategy (Note [Closed sets] in core/enum_names.h).
enum class StrategyKind { DDP, Zero1, Zero2, Zero3 };  ///< ddp | zero1 | zero2 | zero3
enum class Precision { FP32, BF16, FP16 };             ///< fp32 | bf16 | fp16
enum class ReduceDtype { FP32, BF16 };                 ///< fp32 | bf16
enum class OptimizerKind { SGD, Adam, AdamW };         ///< sgd | adam | adamw
/// How DDP writes a checkpoint: auto | file (rank 0 writes one .dtc) | sharded (every rank
/// writes its share, Note [Saving replicated state]). ZeRO always writes sharded.
enum class CheckpointLayout { Auto, File, Sharded };
enum class OffloadDevice { None, CPU, NVMe };  ///< none | cpu | nvme
const NameTable<StrategyKind>& names(StrategyKind);
const NameTable<Precision>& names(Precision);
const NameTable<ReduceDtype>& names(ReduceDtype);
const NameTable<OptimizerKind>& names(OptimizerKind);
const NameTable<CheckpointLayout>& names(CheckpointLayout);
const NameTable<OffloadDevice>& names(OffloadDevice);
/// The ZeRO stage of a strategy (0 for ddp).
int zero_stage(StrategyKind k);

/// The optimizer a strategy steps.
struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::SGD;  ///< sgd (with momentum) | adam | adamw
  double lr = 0.01;                         ///< a schedule's peak (train/config/lr_schedule.h)
  double momentum = 0.9;                    ///< sgd
  /// Every optimizer (adamw decoupled, sgd and adam as L2); unset: 0.01 for adamw
  /// (PyTorch's default), 0 for sgd and adam.
  std::optional<double> weight_decay;
  std::vector<double> betas{0.9, 0.999};  ///< adam, adamw
  double eps = 1e-8;                      ///< adam, adamw: added to the denominator
};

/// What a step computes and reduces in. Master weights stay fp32 whatever `compute` is.
struct PrecisionConfig {
  /// The compute precision; fp16 scales the loss (Note [Loss scaling] in
  /// train/strategy/loss_scaler.h).
  Precision compute = Precision::FP32;
  ReduceDtype reduce_dtype = ReduceDtype::FP32;  ///< gradient reduction
  /// fp16's loss scaling (Note [Loss scaling]); the flags of DeepSpeed's "fp16" block
  LossScaleConfig loss_scale;
};

/// Where ZeRO keeps the optimizer's state and ZeRO-3 its parameter shards: DeepSpeed's
/// zero_optimization.offload_optimizer and offload_param.
struct OffloadConfig {
  /// none | cpu (host memory, where a run on the CPU keeps it anyway; on a GPU, Note [State on
  /// the host] in parallel/zero/sharded_model.cpp) | nvme (a file per rank in `dir` between
  /// steps; Note [Optimizer state on disk] in parallel/zero/offload.h)
  OffloadDevice optimizer = OffloadDevice::None;
  /// zero3: none | cpu (as above) | nvme (the fp32 master shards in a file per rank in `dir`
  /// between uses; needs `optimizer` nvme; Note [Parameters on disk] in
  /// parallel/zero/param_offload.h)
  OffloadDevice params = OffloadDevice::None;
  std::string dir;     ///< nvme: the folder of the files, on a fast local disk
  int buffers = 4;     ///< nvme: host buffers of state in flight
  int buffer_mb = 32;  ///< nvme: each buffer's MiB; a shard steps in pieces of this size
  /// Whether anything is offloaded: on a GPU, the state then lives on the host.
  bool any() const { return optimizer != OffloadDevice::None || params != OffloadDevice::None; }
};

/// How a model is spread over the data-parallel ranks and optimised: one struct for `dtorch
/// train`, `dtorch bench memory` and C++ programs (train/parallelize.h).
struct StrategyConfig {
  StrategyKind kind = StrategyKind::DDP;
  /// Where each rank computes (Note [One GPU per rank] in core/device.h; resolved by
  /// resolve_run_device).
  DeviceKind device = DeviceKind::CPU;
  OptimizerConfig optimizer;
  PrecisionConfig precision;
  int64_t min_unit_params = 0;  ///< zero3 wrap policy (0: one unit per block)
  /// zero3: release the root unit after forward too (zero::Options::reshard_root_after_forward)
  bool reshard_root_after_forward = false;
  /// zero3 under --pp: release units between micro-batches (zero::Options::
  /// reshard_after_microbatch; Note [ZeRO-3 under a pipeline])
  bool reshard_after_microbatch = false;
  OffloadConfig offload;     ///< zero1-3: where the optimizer's state (and zero3's shards) live
  std::string model;         ///< the model's registry name (to rebuild saved stages)
  models::ImageInput input;  ///< what an image model was built for (the same)
  ddp::Options ddp;          ///< bucket_cap_mb also sizes the zero1/zero2 units
  /// ddp's checkpoints; auto: sharded when the ranks replicate kAutoShardedBytes or more of
  /// parameters and optimizer state, one file below
  CheckpointLayout checkpoint_layout = CheckpointLayout::Auto;
};

/// auto's threshold for sharded ddp checkpoints: below it one file is as fast, and fewer files.
inline constexpr int64_t kAutoShardedBytes = int64_t{64} << 20;

/// Throw ConfigError naming the bad field and the fix.
void validate(const OptimizerConfig& c);
void validate(const StrategyConfig& c);

/// --dp-replicate `replicas` (as given: a count or "auto") under strategy `k`: ConfigError under
/// ddp, which replicates everything already (Note [Hybrid sharding]).
void check_replicas_need_zero(StrategyKind k, const std::string& replicas);

/// The weight decay `c` trains with: the one given, else 0.01 for adamw (PyTorch's default)
/// and 0 for sgd and adam.
double weight_decay_of(const OptimizerConfig& c);

}  // namespace config
}  // namespace dtorch::train
