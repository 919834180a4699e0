// Tests for DeepSpeed configuration files (Note [DeepSpeed configuration]): every key read,
// DeepSpeed's batch rule, flags winning over the file, and an error for each kind of bad input.
#include "dtorch/train/config/deepspeed_config.h"

#include <gtest/gtest.h>

#include "dtorch/core/error.h"
#include "dtorch/train/trainer.h"
#include "support/error_of.h"

namespace dtorch::train {
namespace {

DeepSpeedSettings parse(const std::string& text) {
  return parse_deepspeed_config(text, "ds.json");
}

// The message of the ConfigError that parsing `text` throws.
std::string error_of(const std::string& text) {
  return testing::error_of([&] { parse(text); });
}

void expect_error(const std::string& text, const std::vector<std::string>& says) {
  const std::string e = error_of(text);
  ASSERT_NE(e, "(no error)") << "no error for " << text;
  for (const auto& s : says)
    EXPECT_NE(e.find(s), std::string::npos) << "'" << s << "' not in: " << e;
}

bool mentions(const std::vector<std::string>& lines, const std::string& s) {
  for (const auto& l : lines)
    if (l.find(s) != std::string::npos) return true;
  return false;
}

// The ds_config.json of the LUMI tutorial (../shared/seeds/), as printed there: the comma
// after `false` is not JSON.
const char* kLumi = R"({
  "zero_optimization": {
    "stage": 1
  },

  "fp16": {
    "enabled": false,
  }
})";

TEST(DeepSpeedConfig, TheLumiTutorialsFileGetsItsLineAndColumn) {
  expect_error(kLumi, {"ds.json:8:3: not valid JSON", "remove the ',' at line 7, column 21"});
  std::string fixed = kLumi;
  fixed.erase(fixed.find("false,") + 5, 1);
  auto s = parse(fixed);
  EXPECT_EQ(s.strategy, StrategyKind::Zero1);
  EXPECT_FALSE(s.precision.has_value()) << "fp16 disabled says nothing of bf16";
  EXPECT_TRUE(s.warnings.empty());
}

TEST(DeepSpeedConfig, EveryKeyDtorchImplementsIsRead) {
  auto s = parse(R"({
    "train_batch_size": 64, "train_micro_batch_size_per_gpu": 8,
    "gradient_accumulation_steps": 4,
    "zero_optimization": {"stage": 3, "reduce_bucket_size": 5e8, "overlap_comm": true,
                          "contiguous_gradients": true, "reduce_scatter": true,
                          "allgather_partitions": true, "allgather_bucket_size": 5e8},
    "bf16": {"enabled": true}, "fp16": {"enabled": false, "loss_scale": 0},
    "communication_data_type": "bf16", "gradient_clipping": 1.5,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.8, 0.95], "eps": 1e-6,
                                              "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupCosineLR",
                  "params": {"total_num_steps": 100, "warmup_num_steps": 10,
                             "warmup_min_ratio": 0.1, "cos_min_ratio": 0.01,
                             "warmup_type": "linear"}},
    "steps_per_print": 5, "wall_clock_breakdown": true,
    "tensorboard": {"enabled": true, "output_path": "logs", "job_name": "run1"}})");
  EXPECT_EQ(s.train_batch_size, 64);
  EXPECT_EQ(s.micro_batch_size, 8);
  EXPECT_EQ(s.accum_steps, 4);
  EXPECT_EQ(s.strategy, StrategyKind::Zero3);
  EXPECT_NEAR(*s.bucket_cap_mb, 5e8 * 4 / (1 << 20), 1e-9) << "elements of fp32";
  EXPECT_EQ(s.precision, Precision::BF16);
  EXPECT_EQ(s.reduce_dtype, ReduceDtype::BF16);
  EXPECT_EQ(s.clip_grad_norm, 1.5);
  EXPECT_EQ(s.optimizer, OptimizerKind::AdamW);
  EXPECT_EQ(s.lr, 3e-4);
  EXPECT_EQ(s.betas, (std::vector<double>{0.8, 0.95}));
  EXPECT_EQ(s.eps, 1e-6);
  EXPECT_EQ(s.weight_decay, 0.1);
  ASSERT_TRUE(s.lr_schedule.has_value());
  EXPECT_EQ(s.lr_schedule->kind, LrScheduleKind::DeepSpeedWarmupCosineLR);
  EXPECT_EQ(s.lr_schedule->warmup_steps, 10);
  EXPECT_EQ(s.lr_schedule->deepspeed.total_num_steps, 100);
  EXPECT_EQ(s.lr_schedule->deepspeed.warmup_min_ratio, 0.1);
  EXPECT_EQ(s.lr_schedule->deepspeed.cos_min_ratio, 0.01);
  EXPECT_EQ(s.lr_schedule->deepspeed.warmup_type, "linear");
  EXPECT_FALSE(s.schedule_peak_lr.has_value()) << "WarmupCosineLR peaks at the optimizer's lr";
  EXPECT_EQ(s.print_every, 5);
  EXPECT_EQ(s.phase_times, true);
  EXPECT_EQ(s.tensorboard, "logs/run1") << "DeepSpeed's os.path.join(output_path, job_name)";
  EXPECT_TRUE(s.warnings.empty()) << s.warnings.front();
  EXPECT_EQ(parse(R"({"tensorboard": {"enabled": true}})").tensorboard, "DeepSpeedJobName");
  EXPECT_FALSE(parse(R"({"tensorboard": {"enabled": false, "output_path": "x"}})").tensorboard);
}

// ZeRO-Infinity's block, as DeepSpeed's tutorials write it: what dtorch does with each key.
TEST(DeepSpeedConfig, OffloadOptimizerMapsToTheOffloadFlags) {
  const char* text = R"({"zero_optimization": {"stage": 3, "offload_optimizer": {
      "device": "nvme", "nvme_path": "/local_nvme", "buffer_count": 6, "pin_memory": true,
      "pipeline_read": true}}})";
  auto s = parse(text);
  EXPECT_EQ(s.offload_optimizer, OffloadDevice::NVMe);
  EXPECT_EQ(s.offload_dir, "/local_nvme");
  EXPECT_EQ(s.offload_buffers, 6);
  EXPECT_TRUE(mentions(s.warnings, "zero_optimization.offload_optimizer.pipeline_read is ignored"));
  EXPECT_EQ(s.warnings.size(), 1u);
  TrainConfig c;
  EXPECT_TRUE(apply_deepspeed_config(s, {}, 2, c).empty());
  EXPECT_EQ(c.strategy.offload.optimizer, OffloadDevice::NVMe);
  EXPECT_EQ(c.strategy.offload.dir, "/local_nvme");
  EXPECT_EQ(c.strategy.offload.buffers, 6);
  TrainConfig f;
  f.strategy.offload.dir = "/scratch";
  auto notes = apply_deepspeed_config(s, {"--offload-dir"}, 2, f);
  EXPECT_EQ(f.strategy.offload.dir, "/scratch");
  EXPECT_TRUE(mentions(notes,
                       "--offload-dir on the command line replaces the file's "
                       "zero_optimization.offload_optimizer.nvme_path"));
  expect_error(R"({"zero_optimization": {"offload_optimizer": {"device": "disk"}}})",
               {"offload_optimizer.device", "nvme"});
}

// ZeRO-Infinity's parameter block (Note [Parameters on disk]): one folder for both.
TEST(DeepSpeedConfig, OffloadParamMapsToTheOffloadFlags) {
  auto s = parse(R"({"zero_optimization": {"stage": 3,
      "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme"},
      "offload_param": {"device": "nvme", "nvme_path": "/local_nvme", "buffer_count": 5,
                        "buffer_size": 1e8, "max_in_cpu": 1e9, "pin_memory": true}}})");
  EXPECT_EQ(s.offload_params, OffloadDevice::NVMe);
  EXPECT_EQ(s.offload_dir, "/local_nvme");
  for (const char* key : {"buffer_count", "buffer_size", "max_in_cpu", "pin_memory"})
    EXPECT_TRUE(mentions(s.warnings, str("zero_optimization.offload_param.", key, " is ignored")))
        << key;
  EXPECT_EQ(s.warnings.size(), 4u);
  TrainConfig c;
  EXPECT_TRUE(apply_deepspeed_config(s, {}, 2, c).empty());
  EXPECT_EQ(c.strategy.offload.params, OffloadDevice::NVMe);
  EXPECT_NO_THROW(validate(c.strategy));
  // Its own folder alone serves both; two folders are one too many.
  EXPECT_EQ(parse(R"({"zero_optimization": {"offload_param": {"nvme_path": "/p"}}})").offload_dir,
            "/p");
  expect_error(R"({"zero_optimization": {
      "offload_optimizer": {"device": "nvme", "nvme_path": "/a"},
      "offload_param": {"device": "nvme", "nvme_path": "/b"}}})",
               {"offload_param.nvme_path is /b", "offload_optimizer.nvme_path is /a",
                "give them the same path"});
}

// ZeRO++'s hierarchical partitioning as hybrid sharding (Note [Hybrid sharding]): the group size
// gives the replicas of the data-parallel ranks; the flag wins; a size that leaves ranks over
// is named.
TEST(DeepSpeedConfig, HpzPartitionSizeMapsToReplicas) {
  auto s = parse(R"({"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 4}})");
  EXPECT_EQ(s.hpz_partition_size, 4);
  EXPECT_TRUE(s.warnings.empty());
  TrainConfig c;
  auto notes = apply_deepspeed_config(s, {}, 16, c);
  EXPECT_EQ(c.parallelism.dp_replicate, 4);
  EXPECT_TRUE(mentions(notes, "zero_hpz_partition_size 4: hybrid sharding, --dp-replicate 4"))
      << notes.front();
  TrainConfig tp;
  tp.parallelism.tp = 2;  // 8 data-parallel ranks: 2 replicas of 4
  apply_deepspeed_config(s, {}, 16, tp);
  EXPECT_EQ(tp.parallelism.dp_replicate, 2);
  TrainConfig f;
  f.parallelism.dp_replicate = 0;
  notes = apply_deepspeed_config(s, {"--dp-replicate"}, 16, f);
  EXPECT_EQ(f.parallelism.dp_replicate, 0);
  EXPECT_TRUE(mentions(notes,
                       "--dp-replicate on the command line replaces the file's "
                       "zero_optimization.zero_hpz_partition_size"));
  TrainConfig odd;
  const std::string e = testing::error_of([&] { apply_deepspeed_config(s, {}, 6, odd); });
  EXPECT_NE(e.find("zero_hpz_partition_size 4 does not divide the 6 data-parallel ranks"),
            std::string::npos)
      << e;
  TrainConfig one;
  EXPECT_TRUE(apply_deepspeed_config(
                  parse(R"({"zero_optimization": {"zero_hpz_partition_size": 1}})"), {}, 4, one)
                  .empty());
  EXPECT_EQ(one.parallelism.dp_replicate, 1);
}

TEST(DeepSpeedConfig, OptimizersTakeDeepSpeedsDefaultsAndItsAdamIsAdamW) {
  auto adam = parse(R"({"optimizer": {"type": "Adam", "params": {"lr": 0.01}}})");
  EXPECT_EQ(adam.optimizer, OptimizerKind::AdamW)
      << "DeepSpeed's engine: adam_w_mode defaults to true";
  EXPECT_EQ(adam.weight_decay, 0.0);
  EXPECT_FALSE(adam.betas.has_value());
  auto plain = parse(R"({"optimizer": {"type": "adam", "params": {"adam_w_mode": false}}})");
  EXPECT_EQ(plain.optimizer, OptimizerKind::Adam) << "names in any case, as DeepSpeed";
  EXPECT_EQ(plain.lr, 1e-3);
  auto sgd = parse(R"({"optimizer": {"type": "SGD", "params": {"lr": 0.1}}})");
  EXPECT_EQ(sgd.optimizer, OptimizerKind::SGD);
  EXPECT_EQ(sgd.momentum, 0.0) << "torch.optim.SGD's default, not dtorch's 0.9";
}

TEST(DeepSpeedConfig, SchedulersMapWithDeepSpeedsDefaults) {
  auto w = parse(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 0.01}}})");
  EXPECT_EQ(w.lr_schedule->kind, LrScheduleKind::DeepSpeedWarmupLR);
  EXPECT_EQ(w.lr_schedule->warmup_steps, 1000);
  EXPECT_EQ(w.lr_schedule->deepspeed.warmup_type, "log");
  EXPECT_EQ(w.schedule_peak_lr, 0.01);
  auto d = parse(R"({"scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 50}}})");
  EXPECT_EQ(d.schedule_peak_lr, 0.001) << "WarmupDecayLR's own default peak";
  auto o = parse(R"({"scheduler": {"type": "OneCycle", "params": {
      "cycle_min_lr": 0.001, "cycle_max_lr": 0.1, "cycle_first_step_size": 20,
      "cycle_momentum": false, "decay_lr_rate": 0.5, "decay_step_size": 4}}})");
  EXPECT_EQ(o.lr_schedule->deepspeed.cycle_min_lr, 0.001);
  EXPECT_EQ(o.schedule_peak_lr, 0.1);
  EXPECT_EQ(o.lr_schedule->deepspeed.cycle_first_step_size, 20);
  EXPECT_EQ(o.lr_schedule->deepspeed.decay_lr_rate, 0.5);
  EXPECT_TRUE(o.warnings.empty());
  auto momentum = parse(R"({"scheduler": {"type": "OneCycle", "params": {
      "cycle_min_lr": 0.001, "cycle_max_lr": 0.1}}})");
  EXPECT_TRUE(mentions(momentum.warnings, "scheduler.params.cycle_momentum is ignored"))
      << "DeepSpeed cycles momentum by default; dtorch says it does not";
  // Found by UBSan under FuzzSmoke: 2^63 steps became an int64 warm-up without a check.
  EXPECT_THROW(parse(R"({"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0.001,
      "cycle_max_lr": 0.1, "cycle_first_step_size": 9223372036854775807}}})"),
               ConfigError);
}

TEST(DeepSpeedConfig, TheFp16BlockSetsPrecisionAndLossScaling) {
  auto s = parse(R"({"fp16": {"enabled": true, "auto_cast": false, "loss_scale": 0,
      "initial_scale_power": 12, "loss_scale_window": 500, "hysteresis": 3,
      "consecutive_hysteresis": true, "min_loss_scale": 2}, "bf16": {"enabled": false}})");
  EXPECT_EQ(s.precision, Precision::FP16);
  EXPECT_EQ(s.loss_scale, 0);
  EXPECT_EQ(s.initial_scale_power, 12);
  EXPECT_EQ(s.loss_scale_window, 500);
  EXPECT_EQ(s.hysteresis, 3);
  EXPECT_EQ(s.consecutive_hysteresis, true);
  EXPECT_EQ(s.min_loss_scale, 2);
  EXPECT_TRUE(s.warnings.empty());
  TrainConfig c;
  EXPECT_TRUE(apply_deepspeed_config(s, {}, 1, c).empty());
  EXPECT_EQ(c.strategy.precision.compute, Precision::FP16);
  const auto& ls = c.strategy.precision.loss_scale;
  EXPECT_TRUE(ls.dynamic());
  EXPECT_EQ(ls.initial_scale_power, 12);
  EXPECT_EQ(ls.loss_scale_window, 500);
  EXPECT_EQ(ls.hysteresis, 3);
  EXPECT_TRUE(ls.consecutive_hysteresis);
  EXPECT_EQ(ls.min_loss_scale, 2);
  EXPECT_NO_THROW(validate(c.strategy));

  // Hugging Face's template: "auto" counts as absent, so a disabled block that sets nothing.
  auto hf = parse(R"({"fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000,
      "initial_scale_power": 16, "hysteresis": 2, "min_loss_scale": 1}})");
  EXPECT_FALSE(hf.precision.has_value());
  EXPECT_FALSE(hf.loss_scale_window.has_value()) << "DeepSpeed uses none of a disabled block";
  auto defaults = parse(R"({"fp16": {"enabled": true, "loss_scale_window": "auto"}})");
  EXPECT_EQ(defaults.precision, Precision::FP16);
  EXPECT_FALSE(defaults.loss_scale_window.has_value());
  TrainConfig d;
  apply_deepspeed_config(defaults, {}, 1, d);
  EXPECT_EQ(d.strategy.precision.loss_scale.loss_scale_window, 1000) << "DeepSpeed's default";

  // A static scale: the dynamic keys are unused, and DeepSpeed checks only their types.
  auto fixed = parse(R"({"fp16": {"enabled": true, "loss_scale": 128, "loss_scale_window": 0,
      "fp16_master_weights_and_grads": true}})");
  EXPECT_EQ(fixed.loss_scale, 128);
  EXPECT_TRUE(mentions(fixed.warnings, "fp16.fp16_master_weights_and_grads is ignored"));
  EXPECT_EQ(fixed.warnings.size(), 1u);
}

TEST(DeepSpeedConfig, LossScalingFlagsGivenWinOverTheFp16Block) {
  auto s = parse(R"({"fp16": {"enabled": true, "loss_scale_window": 500, "hysteresis": 4,
      "min_loss_scale": 2}})");
  TrainConfig c;
  c.strategy.precision.compute = Precision::BF16;
  c.strategy.precision.loss_scale.loss_scale_window = 20;
  auto notes = apply_deepspeed_config(s, {"--precision", "--loss-scale-window"}, 1, c);
  EXPECT_EQ(c.strategy.precision.compute, Precision::BF16);
  EXPECT_EQ(c.strategy.precision.loss_scale.loss_scale_window, 20);
  EXPECT_EQ(c.strategy.precision.loss_scale.hysteresis, 4);
  EXPECT_EQ(c.strategy.precision.loss_scale.min_loss_scale, 2);
  EXPECT_TRUE(mentions(notes, "--precision on the command line replaces the file's fp16.enabled"));
  EXPECT_TRUE(mentions(notes,
                       "--loss-scale-window on the command line replaces the file's "
                       "fp16.loss_scale_window"));
  EXPECT_EQ(notes.size(), 2u);
}

TEST(DeepSpeedConfig, KnownKeysDtorchIgnoresAreWarningsAndAutoIsAbsent) {
  auto s = parse(R"({"train_batch_size": "auto", "gradient_clipping": "auto",
      "flops_profiler": {"enabled": true},
      "zero_optimization": {"stage": 2, "stage3_max_live_parameters": 1e9,
                            "overlap_comm": false},
      "bf16": {"enabled": "auto"}})");
  EXPECT_FALSE(s.train_batch_size.has_value());
  EXPECT_FALSE(s.clip_grad_norm.has_value());
  EXPECT_FALSE(s.precision.has_value());
  EXPECT_TRUE(mentions(s.warnings, "ds.json: flops_profiler is ignored"));
  EXPECT_TRUE(mentions(s.warnings, "zero_optimization.stage3_max_live_parameters is ignored"));
  EXPECT_TRUE(mentions(s.warnings, "zero_optimization.overlap_comm is ignored: dtorch always"));
  EXPECT_EQ(s.warnings.size(), 3u);
}

TEST(DeepSpeedConfig, UnknownKeysNameTheNearestKnownOne) {
  expect_error(
      R"({"zero_optimisation": {"stage": 1}})",
      {"unknown key 'zero_optimisation' in the top level", "did you mean 'zero_optimization'"});
  expect_error(R"({"zero_optimization": {"stag": 1}})",
               {"unknown key 'stag' in zero_optimization", "'stage'"});
  expect_error(R"({"optimizer": {"type": "Adam", "params": {"learning_rate": 1}}})",
               {"'learning_rate' in optimizer.params"});
  expect_error(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_steps": 5}}})",
               {"did you mean 'warmup_num_steps'"});
  expect_error(R"({"fp16": {"enabled": false, "loss_scal": 0}})", {"'loss_scale'"});
  expect_error(R"({"fp16": {"enabled": true, "loss_scale_windows": 10}})",
               {"unknown key 'loss_scale_windows' in fp16", "did you mean 'loss_scale_window'"});
  expect_error(R"({"optimizer": {"type": "Adamm"}})", {"did you mean 'Adam'"});
  expect_error(R"({"scheduler": {"type": "CosineLR"}})", {"'WarmupCosineLR'"});
}

TEST(DeepSpeedConfig, BadTypesAndValuesNameTheKeyAndWhatItTakes) {
  expect_error(R"({"zero_optimization": {"stage": "one"}})",
               {"zero_optimization.stage must be a whole number from 0 to 3", "\"one\""});
  expect_error(R"({"zero_optimization": {"stage": 4}})", {"from 0 to 3 (got 4)"});
  expect_error(R"({"zero_optimization": 1})", {"zero_optimization must be an object"});
  expect_error(R"({"train_batch_size": 0})", {"train_batch_size must be a whole number >= 1"});
  expect_error(R"({"train_micro_batch_size_per_gpu": 2.5})", {"(got 2.5)"});
  expect_error(R"({"bf16": {"enabled": "yes"}})", {"bf16.enabled must be true or false"});
  expect_error(R"({"gradient_clipping": -1})", {"gradient_clipping must be a number >= 0"});
  expect_error(R"({"optimizer": {"type": "Adam", "params": {"betas": [0.9]}}})",
               {"optimizer.params.betas must be two numbers"});
  expect_error(R"({"optimizer": {"type": "Adam", "params": {"lr": 0}}})",
               {"optimizer.params.lr must be a number above 0"});
  expect_error(R"({"optimizer": {"params": {"lr": 1}}})", {"optimizer needs a \"type\""});
  expect_error(R"({"optimizer": {"type": "Lamb"}})",
               {"optimizer.type Lamb is not implemented in dtorch", "use Adam, AdamW or SGD"});
  expect_error(R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})",
               {"bf16.enabled and fp16.enabled are both true", "enable one of them"});
  expect_error(R"({"bfloat16": {"enabled": true}, "fp16": {"enabled": true}})", {"both true"});
  expect_error(R"({"fp16": {"enabled": true, "loss_scale": -1}})",
               {"fp16.loss_scale must be a number"});
  expect_error(R"({"fp16": {"enabled": true, "loss_scale_window": 0}})",
               {"fp16.loss_scale_window must be a whole number", "(got 0)"});
  expect_error(R"({"fp16": {"enabled": true, "hysteresis": 1.5}})", {"fp16.hysteresis"});
  expect_error(R"({"fp16": {"enabled": true, "min_loss_scale": 0}})",
               {"fp16.min_loss_scale must be a number above 0"});
  expect_error(R"({"fp16": {"enabled": true, "initial_scale_power": 2, "min_loss_scale": 8}})",
               {"fp16.min_loss_scale 8 is above the initial scale 2^2"});
  expect_error(R"({"fp16": {"enabled": true, "consecutive_hysteresis": 1}})",
               {"fp16.consecutive_hysteresis must be true or false"});
  expect_error(R"({"communication_data_type": "fp16"})", {"use fp32 or bf16"});
  expect_error(R"({"bf16": {"enabled": true}, "bfloat16": {"enabled": true}})", {"not both"});
  expect_error(R"({"scheduler": {"type": "WarmupDecayLR"}})",
               {"WarmupDecayLR needs params.total_num_steps"});
  expect_error(R"({"scheduler": {"type": "OneCycle", "params": {"cycle_max_lr": 1}}})",
               {"needs params.cycle_min_lr and params.cycle_max_lr"});
  expect_error(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "exp"}}})",
               {"'exp' is not one of log, linear"});
  expect_error(R"({"scheduler": {"type": "LRRangeTest"}})", {"LRRangeTest is not implemented"});
  expect_error(R"({"steps_per_print": true})", {"steps_per_print must be a whole number"});
  expect_error(R"({"wall_clock_breakdown": 1})", {"wall_clock_breakdown must be true or false"});
  expect_error(R"({"tensorboard": {"enabled": true, "output_path": 3}})",
               {"tensorboard.output_path must be a string"});
  expect_error(R"({"zero_optimization": {"stage": 1, "stage": 2}})",
               {"the key 'stage' appears twice"});
  expect_error(R"([1, 2])", {"the top level must be an object"});
  expect_error("{\n  \"train_batch_size\": 8\n  \"bf16\": {}\n}", {"ds.json:3:8: not valid JSON"});
  try {
    read_deepspeed_config("/nonexistent/ds_config.json");
    ADD_FAILURE() << "no error for a missing file";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--deepspeed-config /nonexistent/ds_config.json"),
              std::string::npos)
        << e.what();
  }
}

TEST(DeepSpeedConfig, FlagsGivenWinOverTheFile) {
  auto s = parse(R"({"train_batch_size": 32, "gradient_accumulation_steps": 2,
      "zero_optimization": {"stage": 2}, "gradient_clipping": 1,
      "optimizer": {"type": "AdamW", "params": {"lr": 0.001, "weight_decay": 0.2}},
      "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 0.005,
                                                   "warmup_num_steps": 7}}})");
  TrainConfig c;
  auto notes = apply_deepspeed_config(s, {}, 2, c);
  EXPECT_TRUE(notes.empty());
  EXPECT_EQ(c.training.batch_size, 8);
  EXPECT_EQ(c.training.accum_steps, 2);
  EXPECT_EQ(c.strategy.kind, StrategyKind::Zero2);
  EXPECT_EQ(c.training.clip_grad_norm, 1);
  EXPECT_EQ(c.strategy.optimizer.kind, OptimizerKind::AdamW);
  EXPECT_EQ(c.strategy.optimizer.weight_decay, 0.2);
  EXPECT_EQ(c.strategy.optimizer.lr, 0.005) << "the scheduler's peak";
  EXPECT_EQ(c.training.lr_schedule.kind, LrScheduleKind::DeepSpeedWarmupLR);
  EXPECT_EQ(c.training.lr_schedule.warmup_steps, 7);

  TrainConfig f;
  f.strategy.kind = StrategyKind::Zero1;
  f.strategy.optimizer.lr = 0.1;
  f.training.batch_size = 4;
  notes = apply_deepspeed_config(s, {"--strategy", "--lr", "--batch-size"}, 4, f);
  EXPECT_EQ(f.strategy.kind, StrategyKind::Zero1);
  EXPECT_EQ(f.strategy.optimizer.lr, 0.1);
  EXPECT_EQ(f.training.batch_size, 4);
  EXPECT_EQ(f.training.accum_steps, 2) << "32 = 4 x 2 x 4 ranks";
  EXPECT_TRUE(mentions(notes,
                       "--strategy on the command line replaces the file's "
                       "zero_optimization.stage"));

  TrainConfig g;
  g.training.lr_schedule.kind = LrScheduleKind::WarmupCosine;
  apply_deepspeed_config(s, {"--lr-schedule"}, 2, g);
  EXPECT_EQ(g.training.lr_schedule.kind, LrScheduleKind::WarmupCosine);
  EXPECT_EQ(g.strategy.optimizer.lr, 0.001) << "the optimizer's lr; the scheduler was replaced";

  TrainConfig bad;
  EXPECT_THROW(apply_deepspeed_config(s, {"--batch-size"}, 4, bad), ConfigError)
      << "--batch-size 64 x 2 x 4 ranks != 32";
  TrainConfig pipe;
  pipe.parallelism.pp = 2;
  apply_deepspeed_config(s, {}, 4, pipe);  // dp 2
  EXPECT_EQ(pipe.training.batch_size, 16) << "a pipeline's batch is all its micro-batches";
  EXPECT_EQ(pipe.parallelism.microbatches, 2);
  EXPECT_EQ(pipe.training.accum_steps, 1);
}

}  // namespace
}  // namespace dtorch::train
