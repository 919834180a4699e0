// A strategy's settings (strategy_config.h): the names of their closed sets and their
// validation.
#include "dtorch/train/config/strategy_config.h"

#include "dtorch/core/error.h"
#include "dtorch/parallel/zero/stage_names.h"

namespace dtorch::train {
inline namespace config {

const NameTable<StrategyKind>& names(StrategyKind) {
  static const NameTable<StrategyKind> n = [] {
    NameTable<StrategyKind> t;
    for (StrategyKind k :
         {StrategyKind::DDP, StrategyKind::Zero1, StrategyKind::Zero2, StrategyKind::Zero3})
      t.emplace_back(k, zero::stage_names().at(zero_stage(k)));
    return t;
  }();
  return n;
}

const NameTable<Precision>& names(Precision) {
  static const NameTable<Precision> n{
      {Precision::FP32, "fp32"}, {Precision::BF16, "bf16"}, {Precision::FP16, "fp16"}};
  return n;
}

const NameTable<ReduceDtype>& names(ReduceDtype) {
  static const NameTable<ReduceDtype> n{{ReduceDtype::FP32, "fp32"}, {ReduceDtype::BF16, "bf16"}};
  return n;
}

const NameTable<OptimizerKind>& names(OptimizerKind) {
  static const NameTable<OptimizerKind> n{
      {OptimizerKind::SGD, "sgd"}, {OptimizerKind::Adam, "adam"}, {OptimizerKind::AdamW, "adamw"}};
  return n;
}

const NameTable<CheckpointLayout>& names(CheckpointLayout) {
  static const NameTable<CheckpointLayout> n{{CheckpointLayout::Auto, "auto"},
                                             {CheckpointLayout::File, "file"},
                                             {CheckpointLayout::Sharded, "sharded"}};
  return n;
}

const NameTable<OffloadDevice>& names(OffloadDevice) {
  static const NameTable<OffloadDevice> n{
      {OffloadDevice::None, "none"}, {OffloadDevice::CPU, "cpu"}, {OffloadDevice::NVMe, "nvme"}};
  return n;
}

int zero_stage(StrategyKind k) {
  switch (k) {
    case StrategyKind::DDP:
      return 0;
    case StrategyKind::Zero1:
      return 1;
    case StrategyKind::Zero2:
      return 2;
    case StrategyKind::Zero3:
      return 3;
  }
  return 0;
}

double weight_decay_of(const OptimizerConfig& c) {
  return c.weight_decay.value_or(c.kind == OptimizerKind::AdamW ? 0.01 : 0.0);
}

void validate(const OptimizerConfig& c) {
  DTORCH_CHECK_T(ConfigError, c.lr > 0, "--lr must be positive (got ", c.lr, ")");
  DTORCH_CHECK_T(ConfigError, weight_decay_of(c) >= 0, "--weight-decay must be >= 0 (got ",
                 weight_decay_of(c), ")");
  DTORCH_CHECK_T(ConfigError, c.betas.size() == 2, "--betas takes two numbers, as 0.9,0.999 (got ",
                 c.betas.size(), ")");
  DTORCH_CHECK_T(ConfigError,
                 c.betas[0] >= 0 && c.betas[0] < 1 && c.betas[1] >= 0 && c.betas[1] < 1, "--betas ",
                 c.betas[0], ",", c.betas[1], ": each must lie in [0, 1), as 0.9,0.999");
  DTORCH_CHECK_T(ConfigError,
                 c.kind != OptimizerKind::SGD || (c.betas == std::vector<double>{0.9, 0.999}),
                 "--betas apply to adam and adamw; with --optimizer sgd set --momentum instead");
  DTORCH_CHECK_T(ConfigError, c.eps > 0 && c.eps < 1, "--eps ", c.eps,
                 " must lie between 0 and 1 (PyTorch's default: 1e-8)");
}

void check_replicas_need_zero(StrategyKind k, const std::string& replicas) {
  DTORCH_CHECK_T(ConfigError, k != StrategyKind::DDP, "--dp-replicate ", replicas,
                 " splits ZeRO's shards into replicas, and ddp replicates everything already: use "
                 "--strategy zero1, zero2 or zero3, or leave --dp-replicate out");
}

void validate(const StrategyConfig& c) {
  validate(c.optimizer);
  // Checked before it becomes a byte count: 1e30 MiB would overflow it.
  DTORCH_CHECK_T(ConfigError, c.ddp.bucket_cap_mb > 0 && c.ddp.bucket_cap_mb <= 1 << 20,
                 "--bucket-cap-mb must lie above 0 and at most 1048576 (1 TiB) (got ",
                 c.ddp.bucket_cap_mb, "); PyTorch's default is 25");
  DTORCH_CHECK_T(ConfigError, c.min_unit_params >= 0, "--min-unit-params must be >= 0");
  DTORCH_CHECK_T(ConfigError, !c.reshard_root_after_forward || c.kind == StrategyKind::Zero3,
                 "--reshard-root-after-forward releases ZeRO-3's root unit; it needs --strategy "
                 "zero3 (got ",
                 name_of(c.kind), ")");
  DTORCH_CHECK_T(ConfigError,
                 c.checkpoint_layout != CheckpointLayout::File || c.kind == StrategyKind::DDP,
                 "--checkpoint-layout file is ddp's; ", name_of(c.kind),
                 " writes each rank's shards (sharded); make one file of them with `dtorch "
                 "checkpoint consolidate`");
  validate(c.precision.loss_scale);
  const OffloadConfig& o = c.offload;
  if (o.optimizer != OffloadDevice::None) {
    DTORCH_CHECK_T(ConfigError, c.kind != StrategyKind::DDP, "--offload-optimizer ",
                   name_of(o.optimizer),
                   " moves the optimizer's shards: it needs --strategy "
                   "zero1, zero2 or zero3 (got ddp, where every rank steps the whole model)");
  }
  DTORCH_CHECK_T(ConfigError, o.optimizer != OffloadDevice::NVMe || !o.dir.empty(),
                 "--offload-optimizer nvme needs --offload-dir DIR, a folder on a fast local "
                 "disk for each rank's file");
  if (o.params != OffloadDevice::None) {
    DTORCH_CHECK_T(ConfigError, c.kind == StrategyKind::Zero3, "--offload-params ",
                   name_of(o.params), " moves ZeRO-3's parameter shards: it needs --strategy ",
                   "zero3 (got ", name_of(c.kind), ", where every rank holds the whole model)");
  }
  DTORCH_CHECK_T(ConfigError, o.params != OffloadDevice::NVMe || o.optimizer == OffloadDevice::NVMe,
                 "--offload-params nvme needs --offload-optimizer nvme too (got ",
                 name_of(o.optimizer),
                 "): the step reads each shard's parameters in with its "
                 "optimizer state, one shard at a time");
  DTORCH_CHECK_T(ConfigError, o.buffers >= 1 && o.buffers <= 1024, "--offload-buffers ", o.buffers,
                 " must lie between 1 and 1024 (default 4)");
  DTORCH_CHECK_T(ConfigError, o.buffer_mb >= 1 && o.buffer_mb <= 65536, "--offload-buffer-mb ",
                 o.buffer_mb, " must lie between 1 and 65536 (default 32)");
}

}  // namespace config
}  // namespace dtorch::train
