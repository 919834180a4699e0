// `dtorch train`: the training job from the command line. Runs alone, under `dtorch launch`
// or torchrun, or (with --nproc-per-node N) launches N copies of itself. Its settings are the
// run configuration's fields (train/config/run_config.h); the other flags here say where settings
// come from (--config, --deepspeed-config, --global-batch-size) and how to launch.

#include <iostream>
#include <nlohmann/json.hpp>

#include "dtorch/core/log.h"
#include "dtorch/core/paths.h"
#include "dtorch/report/profiler.h"
#include "dtorch/train/preemption.h"
#include "dtorch/train/run_folder.h"
#include "dtorch/train/trainer.h"
#include "tools/commands.h"

namespace dtorch::tools {
namespace {

struct TrainFlags {
  train::TrainConfig config;
  int nproc_per_node = 0;
  std::string log_dir;            // with nproc_per_node: the launcher's --log-dir
  int max_restarts = 0;           // with nproc_per_node: the launcher's --max-restarts
  std::string config_file;        // a config.json: the settings the flags given do not set
  std::string deepspeed_config;   // a ds_config.json (Note [DeepSpeed configuration])
  int64_t global_batch_size = 0;  // samples per optimizer step over the data-parallel ranks
  bool print_config = false;
};

// Note [The job's size in config.json] (train/config/run_config.h): started by hand without
// --nproc-per-node, `--config FILE` trains at the size of the file's job.
void rerun_at_the_files_size(const train::JobSize& job, const std::string& file, SelfLaunch& how) {
  if (!job.known() || how.nproc_per_node > 0 || started_by_a_launcher()) return;
  DTORCH_CHECK_T(ConfigError, job.nnodes == 1, "--config ", file,
                 " is the configuration of a job of ", job.nnodes, " nodes x ", job.nproc_per_node,
                 " ranks; start it on as many nodes (dtorch launch --nnodes ", job.nnodes,
                 " --nproc-per-node ", job.nproc_per_node,
                 " on each, or srun), or give --nproc-per-node to train on this node alone");
  how.nproc_per_node = job.nproc_per_node;
}

int run_train(const TrainFlags& f, const std::set<std::string>& command_line) {
  SelfLaunch how;  // Note [Self-launch]
  how.nproc_per_node = f.nproc_per_node;
  how.log_dir = f.log_dir;
  how.max_restarts = f.max_restarts;
  // Every source, then the defaults that follow from them, once (train::resolve).
  train::TrainConfig c = f.config;
  train::ConfigSources sources;
  sources.given = command_line;
  sources.command_line = command_line;
  train::TrainConfig file;
  if (!f.config_file.empty()) {
    file = train::read_config_file(f.config_file, &sources.given, &sources.config_file_job);
    c = train::overlay_flags(file, f.config, command_line);
    sources.config_file = &file;
    sources.config_file_name = f.config_file;
    rerun_at_the_files_size(sources.config_file_job, f.config_file, how);
  }
  sources.global_batch_size = f.global_batch_size;
  sources.deepspeed_config = f.deepspeed_config;
  const train::JobSize job = job_size(how);
  sources.world_size = job.world_size;
  const train::Resolution resolved = train::resolve(c, sources);  // fail before launching
  if (f.print_config || reports_for_the_job(how)) {
    for (const auto& w : resolved.warnings)
      log::warn(w);
    for (const auto& n : resolved.notes)
      log::info(n);
  }
  if (f.print_config) {
    std::cout << train::config_file_json(c, job).dump(2) << "\n";
    return 0;
  }
  if (!f.config_file.empty()) {
    // The run writes <out>/config.json: when that is the file read, only with what it says.
    std::error_code in_ec, out_ec;
    const std::string in = paths::canonical(f.config_file, in_ec);
    const std::string out =
        paths::canonical(paths::join(c.checkpointing.out, "config.json"), out_ec);
    DTORCH_CHECK_T(ConfigError,
                   in_ec || out_ec || in != out || train::to_json(c) == train::to_json(file),
                   "--config ", f.config_file, " is the config.json this run writes into --out ",
                   c.checkpointing.out,
                   ", and the flags given change it; give another --out, or pass a copy "
                   "of the file");
  }
  if (!c.reporting.profile.empty()) report::require_profiler();  // before any rank starts
  // Note [One run per folder]: said once, before the workers start (they check again).
  if (launches_workers(how)) train::check_run_folder(c, c.checkpointing.resume);
  how.checkpoint_signal = c.checkpointing.checkpoint_signal;
  if (auto code = self_launch(how)) return *code;
  train::catch_checkpoint_signal(c.checkpointing.checkpoint_signal);
  auto comm = comm::Communicator::from_env();
  try {
    train::train(c, comm);
  } catch (const train::CheckpointedOnSignal&) {
    return launch::kCheckpointedExitCode;  // Note [Checkpoint on a signal]
  }
  return 0;
}

}  // namespace

void add_train_command(CLI::App& app, int& exit_code) {
  auto f = std::make_shared<TrainFlags>();
  auto* cmd = app.add_subcommand(
      "train",
      "Train a model data-parallel (DDP or ZeRO-1/2/3), optionally x tensor-parallel (--tp) or "
      "pipeline-parallel (--pp)");
  add_config_options(cmd, f->config);
  const char* sources = "Sources";
  cmd->add_option("--config", f->config_file,
                  "a config.json (every run writes one into its --out): its settings, with the "
                  "flags given here winning")
      ->group(sources);
  cmd->add_flag("--print-config", f->print_config,
                "print the resolved configuration as config.json would hold it, and exit")
      ->group(sources);
  cmd->add_option("--deepspeed-config,--deepspeed_config", f->deepspeed_config,
                  "a DeepSpeed ds_config.json: its batch sizes, zero_optimization, bf16, fp16, "
                  "optimizer, scheduler, gradient_clipping, steps_per_print and "
                  "wall_clock_breakdown; flags given here win (docs/deepspeed-config.md)")
      ->group(sources);
  cmd->add_option("--global-batch-size", f->global_batch_size,
                  "samples per optimizer step over all data-parallel ranks (DeepSpeed's "
                  "train_batch_size): the batch per rank follows the job's size, so an elastic "
                  "job keeps its steps when nodes come and go")
      ->check(CLI::PositiveNumber)
      ->group(sources);
  const char* launch = "Launch";
  cmd->add_flag("--resume", f->config.checkpointing.resume,
                "continue from the newest good checkpoint in --out")
      ->group(launch);
  cmd->add_flag("--overwrite", f->config.checkpointing.overwrite,
                "replace the run --out holds (its files are removed once this run's first "
                "checkpoint is written); without it or --resume, a folder holding another "
                "run's checkpoints or model is refused")
      ->group(launch);
  cmd->add_option("--nproc-per-node,--nproc_per_node", f->nproc_per_node,
                  "launch this many local ranks (like `dtorch launch --standalone`)")
      ->group(launch);
  cmd->add_option("--max-restarts", f->max_restarts,
                  "with --nproc-per-node: restart the group this many times after a failure; it "
                  "resumes from the newest checkpoint in --out")
      ->group(launch);
  cmd->add_option("--log-dir", f->log_dir,
                  "with --nproc-per-node: also write each rank's output to DIR/rank<rank>.log")
      ->group(launch);
  cmd->callback([f, cmd, &exit_code] { exit_code = run_train(*f, flags_given(*cmd)); });
}

}  // namespace dtorch::tools
