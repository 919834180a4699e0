// `dtorch bench optimizer`: the host's AdamW step over flat shards of the sizes given, as ZeRO
// steps its shards (optim::FusedAdamW, Note [Fused optimizers]), with their state in memory or
// on disk (--offload-dir: Note [Optimizer state on disk]). bench/bench_host_adam.py runs it
// beside DeepSpeed's DeepSpeedCPUAdam on the same shard sizes and threads.
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <iostream>
#include <memory>

#include "dtorch/core/error.h"
#include "dtorch/core/freed_memory.h"
#include "dtorch/optim/fused.h"
#include "dtorch/parallel/zero/offload.h"
#include "dtorch/train/step_stats.h"
#include "tools/commands.h"

namespace dtorch::tools {
namespace {

struct BenchOptimizerFlags {
  std::vector<int64_t> shards;
  int threads = 1;
  int steps = 10;
  int warmup = 3;
  std::string offload_dir;  ///< "": the state in memory
};

int bench_optimizer(const BenchOptimizerFlags& f) {
  DTORCH_CHECK_T(ConfigError, !f.shards.empty(),
                 "bench optimizer: give --shards N[,N...], each shard's parameters");
  for (int64_t n : f.shards)
    DTORCH_CHECK_T(ConfigError, n >= 1, "bench optimizer: a shard of ", n,
                   " parameters: give each 1 or more (--shards)");
  DTORCH_CHECK_T(ConfigError, f.threads >= 1 && f.steps >= 1 && f.warmup >= 0,
                 "bench optimizer: --threads and --steps must be >= 1, --warmup >= 0 (got ",
                 f.threads, ", ", f.steps, ", ", f.warmup, ")");
  torch::set_num_threads(f.threads);
  // Training keeps freed memory for the next step (Note [Returning released memory]).
  set_freed_memory(FreedMemory::Reuse);
  torch::manual_seed(0);
  std::vector<torch::Tensor> params;
  int64_t total = 0;
  for (int64_t n : f.shards) {
    params.push_back(torch::randn({n}).requires_grad_());
    params.back().mutable_grad() = torch::randn({n});
    total += n;
  }
  optim::FusedAdamW adamw(params, torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
  std::unique_ptr<zero::OptimizerOffload> offload;
  if (!f.offload_dir.empty()) {
    zero::OffloadOptions o;
    o.dir = f.offload_dir;
    o.name = str("dtorch-bench-optimizer-", ::getpid(), ".swap");
    offload = std::make_unique<zero::OptimizerOffload>(adamw, params, o);
  }
  auto step = [&] {
    if (offload) {
      offload->step();
    } else {
      adamw.step();
    }
  };
  for (int i = 0; i < f.warmup; ++i)
    step();
  std::vector<double> seconds;
  for (int i = 0; i < f.steps; ++i) {
    const auto t0 = train::Clock::now();
    step();
    seconds.push_back(train::seconds_since(t0));
  }
  const double median = train::median_seconds(seconds);
  double checksum = 0;  // the parameters stepped, so that a step skipped would show
  for (const auto& p : params)
    checksum += p.sum().item<double>();
  nlohmann::json line = {{"bench", "optimizer"},
                         {"impl", "dtorch"},
                         {"optimizer", "adamw"},
                         {"threads", f.threads},
                         {"shards", f.shards},
                         {"parameters", total},
                         {"state", offload ? "nvme" : "memory"},
                         {"step_seconds", seconds},
                         {"step_seconds_median", median},
                         {"ns_per_parameter", median / double(total) * 1e9},
                         {"checksum", checksum}};
  std::cout << line.dump() << std::endl;
  return 0;
}

}  // namespace

void add_bench_optimizer_command(CLI::App& bench, int& exit_code) {
  auto f = std::make_shared<BenchOptimizerFlags>();
  auto* cmd = bench.add_subcommand(
      "optimizer", "The host's AdamW step over flat shards, as ZeRO steps its own (one process)");
  cmd->add_option("--shards", f->shards, "each shard's parameters (comma-separated)")
      ->delimiter(',')
      ->required();
  cmd->add_option("--threads", f->threads, "intra-op threads")->capture_default_str();
  cmd->add_option("--steps", f->steps, "timed steps")->capture_default_str();
  cmd->add_option("--warmup", f->warmup, "untimed steps first")->capture_default_str();
  cmd->add_option("--offload-dir", f->offload_dir,
                  "keep the state on disk in this folder between steps, as "
                  "--offload-optimizer nvme does (default: in memory)");
  cmd->callback([f, &exit_code] { exit_code = bench_optimizer(*f); });
}

}  // namespace dtorch::tools
