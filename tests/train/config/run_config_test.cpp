// The run configuration (train/config/run_config.h): every field goes through its JSON form and
// back, a file's mistakes are named, flags given win over a --config file, and resolve() derives
// the defaults once (Note [Micro-batches]) without replacing a value given.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "dtorch/core/error.h"
#include "dtorch/train/config/run_config.h"
#include "support/error_of.h"

namespace dtorch::train {
namespace {

using nlohmann::json;

// Gives every field a value other than its default: a field the writer or the reader of the
// JSON form missed keeps its default on the way back, and the comparison fails.
struct Changer {
  std::vector<std::string> flags;
  template <class I>
  void operator()(const Field& f, I& v) {
    flags.push_back(f.flag);
    v = static_cast<I>(v + 3);
  }
  void operator()(const Field& f, bool& v) {
    flags.push_back(f.flag);
    v = !v;
  }
  void operator()(const Field& f, double& v) {
    flags.push_back(f.flag);
    v = v * 3 + 0.1;  // not exact in binary: the JSON form must keep every bit
  }
  void operator()(const Field& f, std::string& v) {
    flags.push_back(f.flag);
    v += "-x";
  }
  void operator()(const Field& f, std::optional<double>& v) {
    flags.push_back(f.flag);
    v = 0.07;
  }
  void operator()(const Field& f, std::vector<double>& v) {
    flags.push_back(f.flag);
    v = {0.8, 0.95};
  }
  void operator()(const Field& f, CountOr v) {
    flags.push_back(f.flag);
    v.value = 7;
  }
  template <class E>
  void operator()(const Field& f, Named<E> v) {
    flags.push_back(f.flag);
    v.value = names(E{}).back().first;  // never the default, which comes first or second
  }
};

TEST(RunConfig, EveryFieldGoesThroughItsJsonFormAndBack) {
  TrainConfig c;
  Changer changer;
  visit_fields(c, changer);
  EXPECT_GE(changer.flags.size(), 50u);
  const json j = to_json(c);
  const TrainConfig back = from_json(j, "config.json");
  EXPECT_EQ(to_json(back), j);
  const json defaults = to_json(TrainConfig{});
  for (const auto& section : config_sections()) {
    for (const auto& [flag, value] : j[section].items())
      EXPECT_NE(value, defaults[section][flag]) << section << "." << flag << " kept its default";
  }
  EXPECT_EQ(back.strategy.optimizer.lr, c.strategy.optimizer.lr);
  EXPECT_EQ(back.strategy.optimizer.weight_decay, 0.07);
  EXPECT_EQ(back.reporting.progress.mode, report::ProgressConfig::Mode::Off);
  EXPECT_EQ(back.strategy.ddp.compression, ddp::Compression::BF16);

  // A DeepSpeed schedule's parameters ride along.
  TrainConfig ds;
  ds.training.lr_schedule.kind = LrScheduleKind::DeepSpeedWarmupDecayLR;
  ds.training.lr_schedule.deepspeed.total_num_steps = 77;
  ds.training.lr_schedule.deepspeed.warmup_type = "linear";
  const TrainConfig ds_back = from_json(to_json(ds), "config.json");
  EXPECT_EQ(ds_back.training.lr_schedule.deepspeed.total_num_steps, 77);
  EXPECT_EQ(ds_back.training.lr_schedule.deepspeed.warmup_type, "linear");
}

std::string run_json_error_of(const std::string& text) {
  try {
    from_json(json::parse(text), "run.json");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "no error";
}

TEST(RunConfig, AFilesMistakesAreNamed) {
  EXPECT_NE(run_json_error_of(R"({"training": {"batch_size": 4}})").find("batch-size"),
            std::string::npos)
      << run_json_error_of(R"({"training": {"batch_size": 4}})");
  EXPECT_NE(run_json_error_of(R"({"trainig": {}})").find("training"), std::string::npos);
  const std::string type = run_json_error_of(R"({"training": {"epochs": "two"}})");
  EXPECT_NE(type.find("training.epochs"), std::string::npos) << type;
  EXPECT_NE(type.find("run.json"), std::string::npos) << type;
  const std::string choice = run_json_error_of(R"({"parallelism": {"strategy": "zero4"}})");
  EXPECT_NE(choice.find("'zero4' is not one of ddp, zero1, zero2, zero3"), std::string::npos)
      << choice;
  EXPECT_NE(run_json_error_of(R"({"optimizer": {"betas": [0.9]}})").find("list of two numbers"),
            std::string::npos);
  EXPECT_NE(run_json_error_of(R"({"training": {"epochs": 1.5}})").find("whole number"),
            std::string::npos);
  // A partial file sets what it gives; the rest keeps the defaults.
  const TrainConfig c = from_json(json::parse(R"({"training": {"epochs": 5}})"), "run.json");
  EXPECT_EQ(c.training.epochs, 5);
  EXPECT_EQ(c.training.batch_size, TrainConfig{}.training.batch_size);
}

// Counts whose 0 means all spell it out; anything else below 0 or not a number is refused.
TEST(RunConfig, SampleCountsAreAllOrAWholeNumber) {
  TrainConfig some;
  some.data.train_samples = 640;
  const json j = to_json(TrainConfig{});
  EXPECT_EQ(j["data"]["train-samples"], "all");
  EXPECT_EQ(to_json(some)["data"]["train-samples"], 640);
  EXPECT_EQ(from_json(j, "run.json").data.train_samples, 0);
  EXPECT_EQ(
      from_json(json::parse(R"({"data": {"test-samples": 0}})"), "run.json").data.test_samples, 0);
  const std::string word = run_json_error_of(R"({"data": {"train-samples": "many"}})");
  EXPECT_NE(word.find("must be \"all\" or a whole number >= 0 (got \"many\")"), std::string::npos)
      << word;
  const std::string negative = run_json_error_of(R"({"data": {"test-samples": -1}})");
  EXPECT_NE(negative.find("test-samples"), std::string::npos) << negative;
  EXPECT_EQ(parse_count_or("all", "--train-samples", "all"), 0);
  EXPECT_EQ(parse_count_or("640", "--train-samples", "all"), 640);
  for (const char* bad : {"-1", "", "12x", "1e3", "99999999999999999999"}) {
    try {
      parse_count_or(bad, "--train-samples", "all");
      ADD_FAILURE() << "took " << bad;
    } catch (const ConfigError& e) {
      const std::string expected =
          std::string("--train-samples takes a whole number >= 0 or all (got ") + bad + ")";
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  }
}

TEST(RunConfig, FlagsGivenWinOverTheFile) {
  TrainConfig file;
  file.strategy.optimizer.lr = 0.5;
  file.training.epochs = 7;
  file.training.lr_schedule.kind = LrScheduleKind::DeepSpeedWarmupLR;
  file.training.lr_schedule.deepspeed.warmup_min_lr = 0.25;
  TrainConfig flags;  // as the command line left it: defaults but for what it gave
  flags.strategy.optimizer.lr = 0.125;
  flags.training.lr_schedule.kind = LrScheduleKind::WarmupCosine;
  flags.checkpointing.resume = true;
  const TrainConfig c = overlay_flags(file, flags, {"--lr", "--lr-schedule"});
  EXPECT_EQ(c.strategy.optimizer.lr, 0.125);
  EXPECT_EQ(c.training.epochs, 7) << "not given: the file's";
  EXPECT_EQ(c.training.lr_schedule.kind, LrScheduleKind::WarmupCosine);
  EXPECT_EQ(to_json(c)["optimizer"].count("deepspeed-schedule"), 0u)
      << "the file's schedule parameters went with its schedule";
  EXPECT_TRUE(c.checkpointing.resume) << "--resume is the invocation's";
}

// `--global-batch-size 32 --pp 2` on 4 ranks once ran one micro-batch a batch whatever
// --microbatches said, and with the interleaved schedule failed on a count nobody gave.
TEST(ResolveConfig, MicroBatchesFollowNoteMicroBatches) {
  auto resolved = [](TrainConfig c, std::set<std::string> given, int64_t global, int world) {
    ConfigSources s;
    s.given = s.command_line = std::move(given);
    s.global_batch_size = global;
    s.world_size = world;
    resolve(c, s);
    return c;
  };
  TrainConfig pipe;
  pipe.model.name = "gpt-debug";
  pipe.data.source = "text";
  pipe.parallelism.pp = 2;
  TrainConfig c = resolved(pipe, {}, 32, 4);
  EXPECT_EQ(c.training.batch_size, 16) << "32 over dp 2";
  EXPECT_EQ(c.parallelism.microbatches, 4) << "2 x pp";
  pipe.parallelism.microbatches = 8;
  c = resolved(pipe, {"--microbatches"}, 32, 4);
  EXPECT_EQ(c.parallelism.microbatches, 8) << "given: kept";
  EXPECT_EQ(c.training.batch_size, 16);
  pipe.parallelism.microbatches = 0;
  pipe.parallelism.schedule = pp::ScheduleKind::Interleaved;
  c = resolved(pipe, {}, 32, 4);
  EXPECT_EQ(c.parallelism.microbatches, 4);
  pipe.parallelism.schedule = pp::ScheduleKind::OneFOneB;
  pipe.training.batch_size = 6;
  c = resolved(pipe, {"--batch-size"}, 0, 2);
  EXPECT_EQ(c.parallelism.microbatches, 3) << "the most below 2 x pp that divides 6";
  pipe.parallelism.schedule = pp::ScheduleKind::Interleaved;
  c = resolved(pipe, {"--batch-size"}, 0, 2);
  EXPECT_EQ(c.parallelism.microbatches, 2) << "interleaved: a multiple of pp";
  pipe.training.batch_size = 5;
  EXPECT_THROW(resolved(pipe, {"--batch-size"}, 0, 2), ConfigError);

  // Conflicts name both values; a given value is never replaced.
  pipe.parallelism.schedule = pp::ScheduleKind::OneFOneB;
  pipe.training.batch_size = 8;
  try {
    resolved(pipe, {"--batch-size"}, 32, 4);
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--batch-size 8 disagrees with --global-batch-size 32"),
              std::string::npos)
        << e.what();
  }
  pipe.training.batch_size = 64;
  pipe.parallelism.microbatches = 3;
  try {
    resolved(pipe, {"--microbatches"}, 32, 4);
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("(--global-batch-size 32 over 2 data-parallel rank(s)) "
                                         "cannot be cut into --microbatches 3"),
              std::string::npos)
        << e.what();
  }
  pipe.training.batch_size = 16;
  EXPECT_THROW(resolved(pipe, {"--microbatches"}, 0, 2), ConfigError) << "16 in 3 micro-batches";
}

TEST(ResolveConfig, SetsTheDefaultsThatFollowOtherSettings) {
  TrainConfig c;
  c.strategy.optimizer.kind = OptimizerKind::AdamW;
  resolve(c, {});
  EXPECT_EQ(c.strategy.optimizer.weight_decay, 0.01) << "PyTorch's AdamW default, written out";
  c.strategy.optimizer.kind = OptimizerKind::SGD;
  resolve(c, {});
  EXPECT_EQ(c.strategy.optimizer.weight_decay, 0.01) << "once set, a setting stays";
  TrainConfig g;
  ConfigSources s;
  s.global_batch_size = 96;
  s.world_size = 4;
  s.given = {"--accum-steps"};
  g.training.accum_steps = 3;
  const Resolution r = resolve(g, s);
  EXPECT_EQ(g.training.batch_size, 8) << "96 = 8 x 3 x 4";
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_NE(r.notes[0].find("batch 8 per rank x 3 accumulation step(s) x 4"), std::string::npos)
      << r.notes[0];
}

// One rule for the size a run records, whether the trainer or `--print-config` writes it.
TEST(JobSizeOf, EqualNodesHaveASizeUnequalOnesNone) {
  const JobSize two_nodes = job_size_of(8, 4);
  EXPECT_EQ(two_nodes.nnodes, 2);
  EXPECT_EQ(two_nodes.nproc_per_node, 4);
  EXPECT_EQ(two_nodes.world_size, 8);
  EXPECT_EQ(job_size_of(1, 1).nnodes, 1);
  EXPECT_FALSE(job_size_of(6, 4).known()) << "a node of 4 and a node of 2";
  EXPECT_FALSE(job_size_of(4, 0).known());
  EXPECT_FALSE(job_size_of(0, 0).known());
}

// A --config file's run at another size, of batch size 0 (a fuzzer's "batch-size": -0), once
// divided by it in keeping the file's global batch; it is a ConfigError like any batch below 1.
TEST(ResolveConfig, AFilesBatchOfZeroAtAnotherSizeIsAConfigError) {
  TrainConfig c;
  c.training.batch_size = 0;
  ConfigSources s;
  s.world_size = 1;
  s.config_file = &c;
  s.config_file_name = "config.json";
  s.config_file_job = JobSize{1, 2, 2};
  EXPECT_THROW(resolve(c, s), ConfigError);
}

std::string parallelism_error_of(const ParallelismConfig& p) {
  try {
    validate(p);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "no error";
}

// The parallelism settings are one struct for dtorch train, dtorch bench memory and
// parallelize(), checked in one place.
TEST(ParallelismConfig, SettingsThatCannotHoldAreNamedWhereverTheyComeFrom) {
  EXPECT_EQ(parallelism_error_of({}), "no error");
  ParallelismConfig p;
  p.microbatches = 4;
  EXPECT_NE(parallelism_error_of(p).find("--microbatches and --pp-split apply to pipelines"),
            std::string::npos);
  p.pp = 2;
  EXPECT_EQ(parallelism_error_of(p), "no error");
  p.sequence_parallel = true;
  EXPECT_NE(parallelism_error_of(p).find("--sequence-parallel"), std::string::npos);
  p.tp = 2;
  p.activation_checkpointing = -1;
  EXPECT_NE(parallelism_error_of(p).find("--activation-checkpointing -1"), std::string::npos);
  TrainConfig c;
  c.parallelism = p;
  EXPECT_THROW(validate(c), ConfigError) << "the run configuration checks the same struct";
  // The data-parallel ranks are what tp x pp leave of the job.
  p.activation_checkpointing = 0;
  EXPECT_EQ(data_parallel_size(p, 8), 2);
  EXPECT_EQ(data_parallel_size(p, 2), 1) << "never below 1: parallelize() names the misfit";
}

// Note [Hybrid sharding]: replicas of a sharded strategy only; auto is a replica a node, and a
// count that leaves ranks over is named with the divisor to give.
TEST(ParallelismConfig, ReplicasNeedZeroAndDivideTheDataParallelRanks) {
  TrainConfig c;
  c.parallelism.dp_replicate = 2;
  const std::string ddp = testing::error_of([&] { validate(c); });
  EXPECT_NE(ddp.find("--dp-replicate 2 splits ZeRO's shards into replicas"), std::string::npos)
      << ddp;
  c.strategy.kind = StrategyKind::Zero3;
  EXPECT_NO_THROW(validate(c));
  ParallelismConfig p;
  p.dp_replicate = 0;
  EXPECT_EQ(resolve_replicas(p, 8, 4).dp_replicate, 2) << "auto: one replica a node";
  EXPECT_EQ(resolve_replicas(p, 4, 4).dp_replicate, 1) << "one node";
  p.pp = 2;
  EXPECT_EQ(resolve_replicas(p, 8, 4).dp_replicate, 1) << "each stage on a node of its own";
  EXPECT_EQ(resolve_replicas(p, 16, 4).dp_replicate, 2) << "each stage on 2 nodes";
  p.pp = 1;
  p.tp = 2;
  EXPECT_EQ(resolve_replicas(p, 16, 8).dp_replicate, 2);
  const std::string odd = testing::error_of([&] { resolve_replicas(p, 6, 3); });
  EXPECT_NE(
      odd.find(
          "--dp-replicate auto (2, one replica a node) does not divide the 3 data-parallel ranks"),
      std::string::npos)
      << odd;
  p.dp_replicate = -1;
  EXPECT_NE(parallelism_error_of(p).find("--dp-replicate -1"), std::string::npos);
}

// Note [Optimizer state on disk]: what offloading needs, named as the flags name it.
TEST(StrategyConfig, OffloadNeedsZeroAFolderAndTheCpu) {
  StrategyConfig s;
  auto strategy_error_of = [](const StrategyConfig& c) {
    return testing::error_of([&] { validate(c); });
  };
  s.offload.optimizer = OffloadDevice::NVMe;
  EXPECT_NE(strategy_error_of(s).find("--offload-optimizer nvme moves the optimizer's shards: it "
                                      "needs --strategy zero1, zero2 or zero3 (got ddp"),
            std::string::npos)
      << strategy_error_of(s);
  s.kind = StrategyKind::Zero3;
  EXPECT_NE(strategy_error_of(s).find("--offload-optimizer nvme needs --offload-dir DIR"),
            std::string::npos);
  s.offload.dir = "/scratch";
  EXPECT_EQ(strategy_error_of(s), "(no error)");
  s.offload.buffers = 0;
  EXPECT_NE(strategy_error_of(s).find("--offload-buffers 0 must lie between 1 and 1024"),
            std::string::npos);
  s.offload.buffers = 4;
  s.offload.buffer_mb = 0;
  EXPECT_NE(strategy_error_of(s).find("--offload-buffer-mb 0 must lie between 1 and 65536"),
            std::string::npos);
  s.offload.buffer_mb = 32;
  s.device = DeviceKind::CUDA;  // Note [State on the host]
  EXPECT_EQ(strategy_error_of(s), "(no error)") << "a GPU's state goes to the host, then disk";
  s.device = DeviceKind::CPU;
  s.offload.optimizer = OffloadDevice::CPU;
  s.offload.dir.clear();
  EXPECT_EQ(strategy_error_of(s), "(no error)") << "cpu needs no folder";
  // Note [Parameters on disk]: ZeRO-3's shards, beside the optimizer's state.
  s.offload.params = OffloadDevice::NVMe;
  s.offload.dir = "/scratch";
  EXPECT_NE(strategy_error_of(s).find("--offload-params nvme needs --offload-optimizer nvme too "
                                      "(got cpu)"),
            std::string::npos)
      << strategy_error_of(s);
  s.offload.optimizer = OffloadDevice::NVMe;
  EXPECT_EQ(strategy_error_of(s), "(no error)");
  s.kind = StrategyKind::Zero2;
  EXPECT_NE(strategy_error_of(s).find("--offload-params nvme moves ZeRO-3's parameter shards: it "
                                      "needs --strategy zero3 (got zero2"),
            std::string::npos)
      << strategy_error_of(s);
}

}  // namespace
}  // namespace dtorch::train
