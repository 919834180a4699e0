// `dtorch bench checkpoint`: how long one checkpoint holds training up, written blocking or in
// the background (--async-checkpoint, Note [Checkpoints in the background]), under any layout
// train::parallelize assembles. Each rank trains --steps optimizer steps on random token
// batches, saves after step --save-at, and prints one JSON line: each step's wall time, the
// stall (how long the save call held the training thread: for a background save, copying the
// state to host memory), how long the save took until every rank's part was written, and the
// checkpoint's bytes. bench/bench_checkpoint.py sets it beside PyTorch DCP's save and
// async_save.
#include <sys/resource.h>
#include <torch/version.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <iostream>

#include "dtorch/core/device.h"
#include "dtorch/core/env.h"
#include "dtorch/core/error.h"
#include "dtorch/core/paths.h"
#include "dtorch/train/background_save.h"
#include "dtorch/train/loss.h"
#include "dtorch/train/parallelize.h"
#include "dtorch/train/strategy/strategy.h"
#include "tools/commands.h"

namespace dtorch::tools {
namespace {

struct SaveStallFlags {
  train::StrategyConfig strategy;
  train::ParallelismConfig parallelism;
  std::string model = "gpt-debug";
  int nproc_per_node = 1;
  int threads = 1;
  int64_t batch_size = 1;
  int64_t seq_len = 64;
  int steps = 6;
  int save_at = 3;
  bool async_save = false;
  std::string dir;  ///< empty: a fresh folder under $TMPDIR, removed at the end
};

// The folder the job saves into, the same on every rank: `given`, which must be empty or
// absent (the benchmark writes and replaces checkpoints there), or a fresh one rank 0 makes.
std::string checkpoint_dir(const std::string& given, comm::Communicator& world) {
  std::string dir = given;
  if (world.rank() == 0) {
    if (dir.empty()) {
      std::error_code ec;
      dir = paths::make_temp_directory("dtorch-bench-checkpoint", ec);
      DTORCH_CHECK_T(CheckpointError, !ec, "bench checkpoint: cannot make a folder under ",
                     env::get("TMPDIR").value_or("/tmp"), " (", ec.message(),
                     "): set TMPDIR or --dir");
    } else {
      DTORCH_CHECK_T(ConfigError, !paths::exists(dir) || paths::is_empty(dir),
                     "bench checkpoint: --dir ", dir, " is not empty; the benchmark writes ",
                     "checkpoints there: give a new or empty folder");
    }
  }
  return world.broadcast_string(dir, 0, "bench checkpoint folder");
}

int checkpoint_worker(const SaveStallFlags& f) {
  torch::set_num_threads(f.threads);
  auto world = comm::Communicator::from_env();
  const at::Device device = train::resolve_run_device(f.strategy.device, world->info());
  torch::manual_seed(0);
  train::ParallelizeSpec spec;
  spec.model = f.model;
  spec.parallelism = f.parallelism;
  spec.strategy = f.strategy;
  spec.device = device;
  train::Parallelized run = train::parallelize(spec, world);
  DTORCH_CHECK_T(ConfigError, run.model->takes_tokens() && !run.layout.pp.pipeline,
                 "bench checkpoint trains a language model (gpt-*) without a pipeline; got ",
                 f.model, f.parallelism.pp > 1 ? " with --pp" : "");
  const train::Layout& layout = run.layout;
  train::Strategy& strategy = *run.strategy;
  const std::string dir = checkpoint_dir(f.dir, *world);
  const int64_t T = std::min(f.seq_len, run.model->max_sequence_length());
  auto gen = at::detail::createCPUGenerator(layout.plan.dp_index(world->rank()));
  const torch::Tensor x =
      layout.local_tokens(torch::randint(0, 256, {f.batch_size, T}, gen).to(device));
  const torch::Tensor y =
      layout.local_tokens(torch::randint(0, 256, {f.batch_size, T}, gen).to(device));
  std::unique_ptr<train::BackgroundSaver> saver;
  if (f.async_save) saver = std::make_unique<train::BackgroundSaver>(strategy);
  std::vector<double> step_seconds;
  std::vector<bool> during_save;  // whether a background save was in flight at the step's start
  double stall = 0, save_total = 0;
  train::Clock::time_point save_start;
  world->barrier("bench start");
  for (int step = 1; step <= f.steps; ++step) {
    during_save.push_back(saver && saver->in_flight());
    auto t = train::Clock::now();
    strategy.set_lr(1e-4);
    {
      parallel::Autocast autocast(strategy.autocast());
      strategy.backward(train::cross_entropy(run.model->forward(x), y, layout.tp.handle.get()),
                        true);
    }
    strategy.step(0);
    synchronize(device);
    if (saver) {
      saver->poll();
      if (during_save.back() && !saver->in_flight()) save_total = train::seconds_since(save_start);
    }
    step_seconds.push_back(train::seconds_since(t));
    if (step != f.save_at) continue;
    save_start = train::Clock::now();
    const checkpoint::CheckpointData data{1, step, "{}"};
    if (saver) {
      saver->save(dir, data, 1);
    } else {
      strategy.save(dir, data, 1);
    }
    stall = train::seconds_since(save_start);
    if (!saver) save_total = stall;
  }
  if (saver && saver->in_flight()) {
    saver->finish();
    save_total = train::seconds_since(save_start);
  }
  world->barrier("bench end");
  int64_t bytes = 0;
  std::error_code ec;
  for (const std::string& file : paths::list_files_recursively(dir, ec))
    bytes += static_cast<int64_t>(paths::file_size(file, ec));
  world->barrier("checkpoint measured");
  if (world->rank() == 0 && f.dir.empty()) paths::remove_all(dir, ec);

  std::vector<double> quiet;  // steps without a save in flight, the save step excepted
  for (size_t i = 0; i < step_seconds.size(); ++i)
    if (!during_save[i] && static_cast<int>(i) + 1 != f.save_at) quiet.push_back(step_seconds[i]);
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  nlohmann::json j = {
      {"impl", "dtorch"},
      {"bench", "checkpoint"},
      {"torch", TORCH_VERSION},
      {"model", f.model},
      {"strategy", name_of(f.strategy.kind)},
      {"mode", f.async_save ? "async" : "blocking"},
      {"rank", world->rank()},
      {"nproc", world->size()},
      {"seq_len", T},
      {"batch_size", f.batch_size},
      {"step_seconds", step_seconds},
      {"steps_during_save", during_save},
      {"step_seconds_median", train::median_seconds(quiet)},
      {"stall_seconds", stall},
      {"save_total_seconds", save_total},
      {"checkpoint_bytes", bytes},
      {"peak_rss_bytes", static_cast<int64_t>(ru.ru_maxrss) * 1024},
      {"device", device.str()},
  };
  std::cout << j.dump() << std::endl;
  return 0;
}

}  // namespace

void add_bench_checkpoint_command(CLI::App& bench, int& exit_code) {
  auto f = std::make_shared<SaveStallFlags>();
  f->strategy.optimizer.kind = train::OptimizerKind::AdamW;
  f->strategy.optimizer.weight_decay = 0.01;
  f->strategy.optimizer.lr = 1e-4;
  auto* cmd = bench.add_subcommand(
      "checkpoint", "How long one checkpoint holds training up, blocking or in the background");
  cmd->add_option("--model", f->model)->capture_default_str();
  add_strategy_options(cmd, f->strategy);
  add_parallelism_options(cmd, f->parallelism);
  cmd->add_option("--nproc-per-node,--nproc_per_node", f->nproc_per_node)->capture_default_str();
  cmd->add_option("--threads", f->threads, "intra-op threads per rank")->capture_default_str();
  cmd->add_option("--batch-size", f->batch_size, "per rank")->capture_default_str();
  cmd->add_option("--seq-len", f->seq_len, "tokens per sequence")->capture_default_str();
  cmd->add_option("--steps", f->steps, "optimizer steps")->capture_default_str();
  cmd->add_option("--save-at", f->save_at, "save after this step")->capture_default_str();
  cmd->add_flag("--async-checkpoint", f->async_save,
                "write the checkpoint in the background (as dtorch train --async-checkpoint)");
  cmd->add_option("--dir", f->dir,
                  "an empty folder to save into (default: a fresh one under $TMPDIR, removed "
                  "at the end)");
  cmd->callback([f, &exit_code] {
    DTORCH_CHECK_T(ConfigError,
                   f->nproc_per_node >= 1 && f->threads >= 1 && f->batch_size >= 1 &&
                       f->seq_len >= 1 && f->save_at >= 1 && f->steps > f->save_at,
                   "bench checkpoint: --nproc-per-node, --threads, --batch-size, --seq-len and "
                   "--save-at must be >= 1, and --steps more than --save-at (got --steps ",
                   f->steps, ", --save-at ", f->save_at, ")");
    DTORCH_CHECK_T(ConfigError, f->parallelism.pp == 1,
                   "bench checkpoint measures a save without a pipeline; got --pp ",
                   f->parallelism.pp, ": leave --pp out");
    train::validate(f->parallelism);
    train::validate(f->strategy);
    auto launched = self_launch_bench(f->nproc_per_node, true);
    exit_code = launched ? *launched : checkpoint_worker(*f);
  });
}

}  // namespace dtorch::tools
