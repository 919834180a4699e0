// DeepSpeed configuration files (Note [DeepSpeed configuration] in deepspeed_config.h): the
// JSON is checked key by key against what DeepSpeed knows, then mapped onto TrainConfig.
#include "dtorch/train/config/deepspeed_config.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "dtorch/core/error.h"
#include "dtorch/core/input_file.h"
#include "dtorch/core/json_config.h"
#include "dtorch/train/config/batch_sizes.h"
#include "dtorch/train/config/run_config.h"

namespace dtorch::train {
inline namespace config {
namespace {

using json = nlohmann::json;
using json_config::Keys;
using json_config::nearest;
using json_config::Section;

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr double kHuge = static_cast<double>(kMax);

// DeepSpeed's top-level keys that dtorch does not implement.
const Keys kIgnoredTop = {"prescale_gradients",
                          "gradient_predivide_factor",
                          "sparse_gradients",
                          "amp",
                          "zero_allow_untested_optimizer",
                          "zero_force_ds_cpu_optimizer",
                          "activation_checkpointing",
                          "flops_profiler",
                          "wandb",
                          "csv_monitor",
                          "comet",
                          "comms_logger",
                          "autotuning",
                          "elasticity",
                          "dataloader_drop_last",
                          "memory_breakdown",
                          "dump_state",
                          "data_efficiency",
                          "curriculum_learning",
                          "compression_training",
                          "aio",
                          "checkpoint",
                          "data_types",
                          "pipeline",
                          "sparse_attention",
                          "disable_allgather",
                          "quantize_training",
                          "eigenvalue",
                          "progressive_layer_drop",
                          "load_universal_checkpoint",
                          "use_node_local_storage",
                          "nebula",
                          "hybrid_engine",
                          "weight_quantization",
                          "torch_autocast",
                          "compile",
                          "seq_parallel_communication_data_type",
                          "gradient_allreduce_op",
                          "timers",
                          "graph_harvesting",
                          "use_data_before_expert_parallelism",
                          "disable_python_gc",
                          "tensor_parallel",
                          "checkpoint_tag_validation"};

void read_batch(const Section& top, DeepSpeedSettings& s) {
  s.train_batch_size = top.integer("train_batch_size", 1, kMax);
  s.micro_batch_size = top.integer("train_micro_batch_size_per_gpu", 1, kMax);
  s.accum_steps = top.integer("gradient_accumulation_steps", 1, kMax);
  s.clip_grad_norm = top.number("gradient_clipping", 0, kHuge);
  s.print_every = top.integer("steps_per_print", 1, kMax);
  s.phase_times = top.boolean("wall_clock_breakdown");
  if (auto t = top.section("tensorboard")) {
    t->keys({"enabled", "output_path", "job_name"}, {});
    if (t->boolean("enabled").value_or(false)) {
      const std::string base = t->text("output_path").value_or("");
      const std::string name = t->text("job_name").value_or("DeepSpeedJobName");
      s.tensorboard = base.empty() ? name : base + "/" + name;
    }
  }
}

void read_zero(const Section& top, DeepSpeedSettings& s) {
  auto z = top.section("zero_optimization");
  if (!z) return;
  z->keys({"stage", "reduce_bucket_size", "overlap_comm", "contiguous_gradients", "reduce_scatter",
           "allgather_partitions", "allgather_bucket_size", "offload_optimizer", "offload_param",
           "zero_hpz_partition_size"},
          {"use_multi_rank_bucket_allreduce",
           "compute_grad_norm",
           "load_from_fp32_weights",
           "elastic_checkpoint",
           "zenflow",
           "sub_group_size",
           "cpu_offload_param",
           "cpu_offload_use_pin_memory",
           "cpu_offload",
           "prefetch_bucket_size",
           "stage3_prefetch_bucket_size",
           "param_persistence_threshold",
           "stage3_param_persistence_threshold",
           "model_persistence_threshold",
           "stage3_model_persistence_threshold",
           "max_live_parameters",
           "stage3_max_live_parameters",
           "max_reuse_distance",
           "stage3_max_reuse_distance",
           "gather_16bit_weights_on_model_save",
           "stage3_gather_16bit_weights_on_model_save",
           "stage3_gather_fp16_weights_on_model_save",
           "module_granularity_threshold",
           "use_all_reduce_for_fetch_params",
           "allgather_sequential",
           "ignore_unused_parameters",
           "legacy_stage1",
           "round_robin_gradients",
           "parameter_alignment",
           "zero_quantized_weights",
           "zero_quantized_nontrainable_weights",
           "zero_quantized_gradients",
           "memory_efficient_linear",
           "pipeline_loading_checkpoint",
           "override_module_apply",
           "log_trace_cache_warnings",
           "enable_sanity_checks",
           "mics_shard_size",
           "mics_hierarchical_params_gather"});
  if (auto stage = z->integer("stage", 0, 3)) {
    static const StrategyKind kStrategies[] = {StrategyKind::DDP, StrategyKind::Zero1,
                                               StrategyKind::Zero2, StrategyKind::Zero3};
    s.strategy = kStrategies[*stage];
  }
  // DeepSpeed counts bucket sizes in elements; dtorch's buckets hold fp32 gradients.
  auto reduce = z->number("reduce_bucket_size", 0, kHuge, /*open_low=*/true);
  if (reduce) s.bucket_cap_mb = *reduce * 4 / (1 << 20);
  if (auto gather = z->number("allgather_bucket_size", 0, kHuge, /*open_low=*/true);
      gather && gather != reduce) {
    z->ignore("allgather_bucket_size",
              "dtorch sizes its gathers as its reductions (reduce_bucket_size, --bucket-cap-mb)");
  }
  for (const char* always :
       {"overlap_comm", "contiguous_gradients", "reduce_scatter", "allgather_partitions"}) {
    if (z->boolean(always) == false) {
      z->ignore(always, str("dtorch always works this way (", always, " true)"));
    }
  }
  s.hpz_partition_size = z->integer("zero_hpz_partition_size", 1, int64_t{1} << 24);
  if (auto off = z->section("offload_optimizer")) {
    off->keys({"device", "nvme_path", "buffer_count", "pin_memory"},
              {"fast_init", "pipeline_read", "pipeline_write", "pipeline", "ratio"});
    if (auto device = off->choice("device", {"none", "cpu", "nvme"}))
      s.offload_optimizer = value_named<OffloadDevice>(*device);
    s.offload_dir = off->text("nvme_path");
    if (auto n = off->integer("buffer_count", 1, 1024)) s.offload_buffers = static_cast<int>(*n);
    off->boolean("pin_memory");  // read for its type: a GPU's state on the host is pinned
  }
  if (auto off = z->section("offload_param")) {
    // Note [Parameters on disk]: the kernel pages them, through no buffers of dtorch's.
    off->keys({"device", "nvme_path"}, {"buffer_count", "buffer_size", "max_in_cpu", "pin_memory"});
    if (auto device = off->choice("device", {"none", "cpu", "nvme"}))
      s.offload_params = value_named<OffloadDevice>(*device);
    if (auto path = off->text("nvme_path")) {
      DTORCH_CHECK_T(ConfigError, !s.offload_dir || *s.offload_dir == *path, top.file(), ": ",
                     off->name("nvme_path"), " is ", *path, " and ",
                     z->name("offload_optimizer.nvme_path"), " is ", *s.offload_dir,
                     "; dtorch keeps both in one folder: give them the same path");
      s.offload_dir = path;
    }
  }
}

// DeepSpeed's "fp16" block: precision fp16 and its loss scaling (Note [Loss scaling]).
void read_fp16(const Section& top, const Section& f, DeepSpeedSettings& s) {
  const Keys known{"enabled",
                   "auto_cast",
                   "loss_scale",
                   "initial_scale_power",
                   "loss_scale_window",
                   "hysteresis",
                   "consecutive_hysteresis",
                   "min_loss_scale",
                   "fp16_master_weights_and_grads"};
  for (const auto& [key, value] : f.value().items()) {
    DTORCH_CHECK_T(ConfigError, std::find(known.begin(), known.end(), key) != known.end(),
                   top.file(), ": unknown key '", key, "' in fp16; did you mean '",
                   nearest(key, known), "'?");
  }
  // A disabled block's other keys change nothing, in DeepSpeed too: read for typos only.
  if (!f.boolean("enabled").value_or(false)) return;
  DTORCH_CHECK_T(ConfigError, s.precision != Precision::BF16, top.file(),
                 ": bf16.enabled and fp16.enabled are both true, which DeepSpeed refuses too; "
                 "enable one of them");
  s.precision = Precision::FP16;
  s.loss_scale = f.number("loss_scale", 0, kHuge);
  // The other keys steer a dynamic scale only; under a static one DeepSpeed checks their
  // types, not their values, and so does this (validate() checks them if a flag makes the
  // scale dynamic).
  const bool dynamic = s.loss_scale.value_or(0) == 0;
  constexpr int64_t kInt = std::numeric_limits<int>::max();
  auto whole = [&](const char* key, int64_t lo, int64_t hi) -> std::optional<int> {
    auto v = f.integer(key, dynamic ? lo : -kInt, dynamic ? hi : kInt);
    return v ? std::optional<int>(static_cast<int>(*v)) : std::nullopt;
  };
  s.initial_scale_power = whole("initial_scale_power", 0, 64);
  s.loss_scale_window = whole("loss_scale_window", 1, kInt);
  s.hysteresis = whole("hysteresis", 1, kInt);
  s.consecutive_hysteresis = f.boolean("consecutive_hysteresis");
  s.min_loss_scale = f.number("min_loss_scale", dynamic ? 0 : -kHuge, kHuge, /*open_low=*/dynamic);
  const int power = s.initial_scale_power.value_or(LossScaleConfig{}.initial_scale_power);
  const double floor = s.min_loss_scale.value_or(LossScaleConfig{}.min_loss_scale);
  DTORCH_CHECK_T(ConfigError, !dynamic || floor <= std::ldexp(1.0, power), top.file(),
                 ": fp16.min_loss_scale ", floor, " is above the initial scale 2^", power,
                 " (fp16.initial_scale_power); lower the one or raise the other");
  f.boolean("auto_cast");  // dtorch runs forward under fp16 autocast either way
  if (f.boolean("fp16_master_weights_and_grads").value_or(false)) {
    f.ignore("fp16_master_weights_and_grads", "dtorch keeps master weights and gradients in fp32");
  }
}

void read_precision(const Section& top, DeepSpeedSettings& s) {
  DTORCH_CHECK_T(ConfigError, !(top.has("bf16") && top.has("bfloat16")), top.file(),
                 ": give bf16 or bfloat16 (the same setting), not both");
  for (const char* key : {"bf16", "bfloat16"}) {
    if (auto b = top.section(key)) {
      b->keys({"enabled"},
              {"immediate_grad_update", "check_grad_overflow", "bf16_master_weights_and_grads",
               "bf16_optimizer_states", "accumulate_grads_via_hooks"});
      if (auto on = b->boolean("enabled")) s.precision = *on ? Precision::BF16 : Precision::FP32;
    }
  }
  if (auto f = top.section("fp16")) read_fp16(top, *f, s);
  if (auto d = top.choice("communication_data_type", {"fp32", "bf16", "fp16"})) {
    DTORCH_CHECK_T(ConfigError, *d != "fp16", top.file(),
                   ": communication_data_type fp16 needs CUDA; use fp32 or bf16");
    s.reduce_dtype = *value_named<ReduceDtype>(*d);
  }
}

void read_optimizer(const Section& top, DeepSpeedSettings& s) {
  auto o = top.section("optimizer");
  if (!o) return;
  o->keys({"type", "params"}, {"legacy_fusion"});
  auto type = o->choice("type",
                        {"Adam", "AdamW", "SGD", "Lamb", "OneBitAdam", "OneBitLamb", "ZeroOneAdam",
                         "Adagrad", "Lion", "MuAdam", "MuAdamW", "MuSGD", "Muon"},
                        /*any_case=*/true);
  DTORCH_CHECK_T(ConfigError, type.has_value(), top.file(),
                 ": optimizer needs a \"type\": Adam, AdamW or SGD");
  DTORCH_CHECK_T(ConfigError, *type == "Adam" || *type == "AdamW" || *type == "SGD", top.file(),
                 ": optimizer.type ", *type,
                 " is not implemented in dtorch; use Adam, AdamW or SGD");
  Section p = o->section("params").value_or(o->empty_section("params"));
  const bool sgd = *type == "SGD";
  if (sgd) {
    p.keys({"lr", "momentum", "weight_decay"}, {"nesterov", "dampening", "maximize", "foreach"});
  } else {
    p.keys({"lr", "betas", "eps", "weight_decay", "adam_w_mode", "torch_adam"},
           {"amsgrad", "bias_correction", "fused", "foreach", "maximize", "capturable",
            "fp32_optimizer_states", "set_grad_none"});
  }
  // DeepSpeed's defaults, which the file means when it leaves a parameter out.
  s.lr = p.number("lr", 0, kHuge, /*open_low=*/true).value_or(1e-3);
  s.weight_decay = p.number("weight_decay", 0, kHuge).value_or(0.0);
  if (sgd) {
    s.optimizer = OptimizerKind::SGD;
    s.momentum = p.number("momentum", 0, 1).value_or(0.0);
    return;
  }
  // DeepSpeed's engine: "Adam" is AdamW unless adam_w_mode is false.
  const bool decoupled = *type == "AdamW" || p.boolean("adam_w_mode").value_or(true);
  p.boolean("torch_adam");  // which implementation; the same update
  s.optimizer = decoupled ? OptimizerKind::AdamW : OptimizerKind::Adam;
  if (const json* b = p.get("betas")) {
    DTORCH_CHECK_T(ConfigError,
                   b->is_array() && b->size() == 2 && (*b)[0].is_number() && (*b)[1].is_number() &&
                       (*b)[0].get<double>() >= 0 && (*b)[0].get<double>() < 1 &&
                       (*b)[1].get<double>() >= 0 && (*b)[1].get<double>() < 1,
                   top.file(),
                   ": optimizer.params.betas must be two numbers in [0, 1), like "
                   "[0.9, 0.999] (got ",
                   b->dump(), ")");
    s.betas = b->get<std::vector<double>>();
  }
  s.eps = p.number("eps", 0, 1, /*open_low=*/true);
}

void read_scheduler(const Section& top, DeepSpeedSettings& s) {
  auto sc = top.section("scheduler");
  if (!sc) return;
  sc->keys({"type", "params"}, {});
  auto type = sc->choice(
      "type", {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "LRRangeTest"});
  DTORCH_CHECK_T(ConfigError, type.has_value(), top.file(),
                 ": scheduler needs a \"type\": WarmupLR, WarmupDecayLR, WarmupCosineLR or "
                 "OneCycle");
  DTORCH_CHECK_T(ConfigError, *type != "LRRangeTest", top.file(),
                 ": scheduler.type LRRangeTest is not implemented in dtorch; use WarmupLR, "
                 "WarmupDecayLR, WarmupCosineLR or OneCycle");
  Section p = sc->section("params").value_or(sc->empty_section("params"));
  LrScheduleConfig c;
  c.kind = *value_named<LrScheduleKind>(*type);
  auto& d = c.deepspeed;
  auto warmup = [&] {
    c.warmup_steps = p.integer("warmup_num_steps", 1, kMax).value_or(1000);
    d.warmup_type = p.choice("warmup_type", {"log", "linear"}).value_or("log");
  };
  auto required_total = [&] {
    auto t = p.integer("total_num_steps", 1, kMax);
    DTORCH_CHECK_T(ConfigError, t.has_value(), top.file(), ": scheduler ", *type,
                   " needs params.total_num_steps (the optimizer step where its decay ends)");
    d.total_num_steps = *t;
  };
  if (*type == "WarmupLR" || *type == "WarmupDecayLR") {
    p.keys({"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "total_num_steps",
            "last_batch_iteration"},
           {});
    DTORCH_CHECK_T(ConfigError, *type == "WarmupDecayLR" || !p.has("total_num_steps"), top.file(),
                   ": scheduler.params.total_num_steps belongs to WarmupDecayLR and "
                   "WarmupCosineLR, not WarmupLR; remove it or change the type");
    warmup();
    d.warmup_min_lr = p.number("warmup_min_lr", 0, kHuge).value_or(0.0);
    s.schedule_peak_lr = p.number("warmup_max_lr", 0, kHuge, /*open_low=*/true);
    if (*type == "WarmupDecayLR") {
      required_total();
      if (!s.schedule_peak_lr) s.schedule_peak_lr = 0.001;  // its default, unlike WarmupLR's
    }
  } else if (*type == "WarmupCosineLR") {
    p.keys({"total_num_steps", "warmup_min_ratio", "warmup_num_steps", "cos_min_ratio",
            "warmup_type", "last_batch_iteration"},
           {});
    warmup();
    required_total();
    d.warmup_min_ratio = p.number("warmup_min_ratio", 0, 1).value_or(0.0);
    d.cos_min_ratio = p.number("cos_min_ratio", 0, 1).value_or(1e-4);
  } else {  // OneCycle
    p.keys({"cycle_min_lr", "cycle_max_lr", "decay_lr_rate", "cycle_first_step_size",
            "cycle_second_step_size", "cycle_first_stair_count", "cycle_second_stair_count",
            "decay_step_size", "cycle_momentum", "last_batch_iteration"},
           {"cycle_min_mom", "cycle_max_mom", "decay_mom_rate"});
    auto low = p.number("cycle_min_lr", 0, kHuge);
    s.schedule_peak_lr = p.number("cycle_max_lr", 0, kHuge, /*open_low=*/true);
    DTORCH_CHECK_T(ConfigError, low && s.schedule_peak_lr, top.file(),
                   ": scheduler OneCycle needs params.cycle_min_lr and params.cycle_max_lr");
    d.cycle_min_lr = *low;
    d.decay_lr_rate = p.number("decay_lr_rate", 0, kHuge).value_or(0.0);
    // Becomes the warm-up's step count: at most 1e18, which an int64 holds (kHuge, 2^63, does
    // not: UBSan under FuzzSmoke).
    d.cycle_first_step_size =
        p.number("cycle_first_step_size", 0, 1e18, /*open_low=*/true).value_or(2000);
    d.cycle_second_step_size = p.number("cycle_second_step_size", 0, kHuge).value_or(-1);
    d.cycle_first_stair_count = p.integer("cycle_first_stair_count", 0, kMax).value_or(0);
    d.cycle_second_stair_count = p.integer("cycle_second_stair_count", 0, kMax).value_or(-1);
    d.decay_step_size = p.number("decay_step_size", 0, kHuge).value_or(0.0);
    c.warmup_steps = static_cast<int64_t>(d.cycle_first_step_size);
    if (p.boolean("cycle_momentum").value_or(true)) {
      p.ignore("cycle_momentum", "dtorch cycles the learning rate only; set it to false to say so");
    }
  }
  if (p.has("last_batch_iteration")) {
    p.ignore("last_batch_iteration", "a resumed run continues the schedule its checkpoint saved");
  }
  s.lr_schedule = c;
}

}  // namespace

DeepSpeedSettings parse_deepspeed_config(const std::string& text, const std::string& name) {
  const json j = json_config::parse(text, name);
  DeepSpeedSettings s;
  Section top(j, "", name, &s.warnings);
  top.keys({"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
            "zero_optimization", "bf16", "bfloat16", "fp16", "communication_data_type",
            "gradient_clipping", "optimizer", "scheduler", "steps_per_print",
            "wall_clock_breakdown", "tensorboard"},
           kIgnoredTop);
  read_batch(top, s);
  read_zero(top, s);
  read_precision(top, s);
  read_optimizer(top, s);
  read_scheduler(top, s);
  return s;
}

DeepSpeedSettings read_deepspeed_config(const std::string& path) {
  std::string text, problem;
  DTORCH_CHECK_T(ConfigError, read_input_file(path, kMaxTextFileBytes, &text, &problem),
                 "--deepspeed-config ", path, ": ", problem,
                 "; give the path of a DeepSpeed JSON configuration");
  return parse_deepspeed_config(text, path);
}

std::vector<std::string> apply_deepspeed_config(const DeepSpeedSettings& ds,
                                                const std::set<std::string>& given, int world_size,
                                                TrainConfig& c) {
  std::vector<std::string> notes;
  // Sets `field` from the file unless `flag` was given; notes when the flag wins.
  auto take = [&](const auto& value, auto& field, const std::string& flag, const char* key) {
    if (!value) return;
    if (given.count(flag)) {
      notes.push_back(str(flag, " on the command line replaces the file's ", key));
      return;
    }
    field = *value;
  };
  take(ds.strategy, c.strategy.kind, "--strategy", "zero_optimization.stage");
  take(ds.bucket_cap_mb, c.strategy.ddp.bucket_cap_mb, "--bucket-cap-mb",
       "zero_optimization.reduce_bucket_size");
  take(ds.offload_optimizer, c.strategy.offload.optimizer, "--offload-optimizer",
       "zero_optimization.offload_optimizer.device");
  take(ds.offload_dir, c.strategy.offload.dir, "--offload-dir",
       "zero_optimization.offload_optimizer.nvme_path");
  take(ds.offload_buffers, c.strategy.offload.buffers, "--offload-buffers",
       "zero_optimization.offload_optimizer.buffer_count");
  take(ds.offload_params, c.strategy.offload.params, "--offload-params",
       "zero_optimization.offload_param.device");
  if (ds.hpz_partition_size && *ds.hpz_partition_size > 1) {  // Note [Hybrid sharding]
    const int64_t group = *ds.hpz_partition_size;
    const int dp = data_parallel_size(c.parallelism, world_size);
    DTORCH_CHECK_T(ConfigError, given.count("--dp-replicate") || dp % group == 0,
                   "zero_optimization.zero_hpz_partition_size ", group, " does not divide the ", dp,
                   " data-parallel ranks: give a divisor of ", dp,
                   " (the ranks a node has), or --dp-replicate");
    take(std::optional<int64_t>(dp / group), c.parallelism.dp_replicate, "--dp-replicate",
         "zero_optimization.zero_hpz_partition_size");
    if (!given.count("--dp-replicate")) {
      notes.push_back(str("zero_optimization.zero_hpz_partition_size ", group,
                          ": hybrid sharding, --dp-replicate ", dp / group, " (the ", dp,
                          " data-parallel ranks as ", dp / group, " replicas of ", group,
                          "; unlike DeepSpeed's hpZ, the optimizer state is sharded over the ",
                          group, " ranks of a replica, not over all ", dp, ")"));
    }
  }
  take(ds.precision, c.strategy.precision.compute, "--precision",
       ds.precision == Precision::FP16 ? "fp16.enabled" : "bf16.enabled");
  auto& ls = c.strategy.precision.loss_scale;
  take(ds.loss_scale, ls.loss_scale, "--loss-scale", "fp16.loss_scale");
  take(ds.initial_scale_power, ls.initial_scale_power, "--initial-scale-power",
       "fp16.initial_scale_power");
  take(ds.loss_scale_window, ls.loss_scale_window, "--loss-scale-window", "fp16.loss_scale_window");
  take(ds.hysteresis, ls.hysteresis, "--hysteresis", "fp16.hysteresis");
  take(ds.consecutive_hysteresis, ls.consecutive_hysteresis, "--consecutive-hysteresis",
       "fp16.consecutive_hysteresis");
  take(ds.min_loss_scale, ls.min_loss_scale, "--min-loss-scale", "fp16.min_loss_scale");
  take(ds.reduce_dtype, c.strategy.precision.reduce_dtype, "--reduce-dtype",
       "communication_data_type");
  take(ds.clip_grad_norm, c.training.clip_grad_norm, "--clip-grad-norm", "gradient_clipping");
  take(ds.optimizer, c.strategy.optimizer.kind, "--optimizer", "optimizer.type");
  take(ds.lr, c.strategy.optimizer.lr, "--lr", "optimizer.params.lr");
  take(ds.momentum, c.strategy.optimizer.momentum, "--momentum", "optimizer.params.momentum");
  take(ds.weight_decay, c.strategy.optimizer.weight_decay, "--weight-decay",
       "optimizer.params.weight_decay");
  take(ds.betas, c.strategy.optimizer.betas, "--betas", "optimizer.params.betas");
  take(ds.eps, c.strategy.optimizer.eps, "--eps", "optimizer.params.eps");
  take(ds.print_every, c.reporting.print_every, "--print-every", "steps_per_print");
  take(ds.phase_times, c.reporting.phase_times, "--phase-times", "wall_clock_breakdown");
  take(ds.tensorboard, c.reporting.tensorboard, "--tensorboard", "tensorboard.output_path");
  if (ds.lr_schedule) {
    const bool replaced =
        given.count("--lr-schedule") || given.count("--warmup-steps") || given.count("--min-lr");
    if (replaced) {
      notes.push_back(
          "--lr-schedule, --warmup-steps or --min-lr on the command line replace "
          "the file's scheduler");
    } else {
      c.training.lr_schedule = *ds.lr_schedule;
      take(ds.schedule_peak_lr, c.strategy.optimizer.lr, "--lr", "scheduler's peak learning rate");
    }
  }
  // DeepSpeed's batch rule over the data-parallel ranks; the flags stand for the micro batch
  // and the accumulation steps (under a pipeline: a rank's batch and its micro-batches).
  if (ds.train_batch_size || ds.micro_batch_size || ds.accum_steps) {
    const int dp = data_parallel_size(c.parallelism, world_size);
    if (c.parallelism.pp > 1) {
      const bool batch = given.count("--batch-size") > 0;
      set_pipeline_batch_sizes(
          resolve_pipeline_batch(
              ds.train_batch_size,
              batch ? std::optional<int64_t>(c.training.batch_size) : std::nullopt,
              given.count("--microbatches") ? std::optional<int64_t>(c.parallelism.microbatches)
                                            : ds.accum_steps,
              batch ? std::nullopt : ds.micro_batch_size, dp),
          c);
      return notes;
    }
    auto micro = given.count("--batch-size") ? std::optional<int64_t>(c.training.batch_size)
                                             : ds.micro_batch_size;
    auto accum = given.count("--accum-steps") ? std::optional<int64_t>(c.training.accum_steps)
                                              : ds.accum_steps;
    if (!micro && !ds.train_batch_size) micro = c.training.batch_size;  // dtorch's default
    set_batch_sizes(resolve_batch_sizes(ds.train_batch_size, micro, accum, dp), c);
  }
  return notes;
}

}  // namespace config
}  // namespace dtorch::train
