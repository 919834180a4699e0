// `dtorch bench memory`: one JSON line per rank of what a layout's training steps hold, send and
// take (train/bench_memory.h): the model-state bytes each rank holds under a strategy against the
// ZeRO paper's formula, the peak RSS, the bytes sent per step and throughput, under any layout
// train::parallelize assembles (--tp, --pp, --cp, --activation-checkpointing).
#include <nlohmann/json.hpp>

#include <iostream>

#include "dtorch/comm/communicator.h"
#include "dtorch/core/error.h"
#include "dtorch/report/profiler.h"
#include "dtorch/train/bench_memory.h"
#include "dtorch/train/config/run_config.h"
#include "dtorch/train/strategy/strategy.h"
#include "tools/commands.h"

namespace dtorch::tools {
namespace {

struct MemoryFlags {
  train::BenchMemoryConfig bench;
  int nproc_per_node = 1;
  int threads = 1;
};

int memory_worker(const MemoryFlags& f) {
  torch::set_num_threads(f.threads);
  std::cout << train::bench_memory(f.bench, comm::Communicator::from_env()).dump() << std::endl;
  return 0;
}

}  // namespace

void add_bench_memory_command(CLI::App& bench, int& exit_code) {
  auto f = std::make_shared<MemoryFlags>();
  train::BenchMemoryConfig& b = f->bench;
  b.strategy.optimizer.kind = train::OptimizerKind::AdamW;
  b.strategy.optimizer.weight_decay = 0.01;  // AdamW's default in PyTorch, as the peers run it
  b.strategy.optimizer.lr = 1e-4;
  auto* cmd = bench.add_subcommand(
      "memory", "Model-state bytes per rank against the ZeRO formulas, peak RSS, traffic");
  cmd->add_option("--model", b.model)->capture_default_str();
  add_strategy_options(cmd, b.strategy);
  cmd->add_option("--nproc-per-node,--nproc_per_node", f->nproc_per_node)->capture_default_str();
  cmd->add_option("--threads", f->threads, "intra-op threads per rank")->capture_default_str();
  cmd->add_option("--batch-size", b.batch_size, "per rank")->capture_default_str();
  cmd->add_option("--seq-len", b.seq_len, "tokens per sequence (gpt)")->capture_default_str();
  cmd->add_option("--warmup-steps", b.warmup_steps, "untimed steps before the timed ones")
      ->capture_default_str();
  cmd->add_option("--steps", b.steps, "timed steps, after the untimed ones")->capture_default_str();
  add_parallelism_options(cmd, b.parallelism);
  cmd->add_option("--image-size", b.image_size,
                  "image models: random 3-channel images of this side (default: 1 x 28 x 28)");
  cmd->add_option("--classes", b.classes, "image models with --image-size: classes (1000)");
  cmd->add_option("--profile", b.profile,
                  "trace steps FIRST:LAST (counting the untimed ones) with LibTorch's profiler "
                  "into --out/trace.rank<N>.json");
  cmd->add_option("--out", b.out, "the folder --profile writes its traces into")
      ->capture_default_str();
  cmd->callback([f, &exit_code] {
    train::BenchMemoryConfig& b = f->bench;
    DTORCH_CHECK_T(
        ConfigError,
        f->nproc_per_node >= 1 && f->threads >= 1 && b.steps >= 1 && b.warmup_steps >= 1 &&
            b.batch_size >= 1 && b.seq_len >= 1 && b.image_size >= 0 && b.classes >= 0,
        "bench memory: --nproc-per-node, --threads, --warmup-steps, --steps, --batch-size and "
        "--seq-len must be >= 1, --image-size and --classes >= 0 (got ",
        f->nproc_per_node, ", ", f->threads, ", ", b.warmup_steps, ", ", b.steps, ", ",
        b.batch_size, ", ", b.seq_len, ", ", b.image_size, " and ", b.classes, ")");
    const report::StepRange profiled = report::parse_step_range(b.profile, "--profile");
    DTORCH_CHECK_T(ConfigError, profiled.last <= b.warmup_steps + b.steps, "--profile ", b.profile,
                   " ends after the last step this runs (", b.warmup_steps + b.steps,
                   ": --warmup-steps ", b.warmup_steps, " + --steps ", b.steps,
                   "); trace steps within it, or raise --steps");
    if (!profiled.empty()) report::require_profiler();
    train::ParallelismConfig& p = b.parallelism;
    train::validate(p);
    if (p.pp > 1 && p.microbatches == 0) {  // Note [Micro-batches]
      p.microbatches = train::default_microbatches(p.pp, p.schedule, b.batch_size);
    }
    train::validate(b.strategy);
    auto launched = self_launch_bench(f->nproc_per_node, true);
    exit_code = launched ? *launched : memory_worker(*f);
  });
}

}  // namespace dtorch::tools
