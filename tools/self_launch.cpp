// Note [Self-launch]: `dtorch train` and `dtorch bench ...` with --nproc-per-node N, started by
// hand, start N local workers of the same command line through the launcher. Started as one
// rank of a job instead (torchrun, dtorch launch, srun, mpirun, qsub: whatever
// launch::rank_info_from_env recognises), they run as that rank, and --nproc-per-node is
// ignored with a warning: under srun a task must not start N workers of its own.

#include "dtorch/core/env.h"
#include "dtorch/core/log.h"
#include "dtorch/core/paths.h"
#include "dtorch/launch/launcher.h"
#include "dtorch/launch/process.h"
#include "dtorch/launch/rank_info.h"
#include "tools/commands.h"

namespace dtorch::tools {

bool started_by_a_launcher() {
  return env::get("RANK").has_value() || launch::rank_info_from_env().world_size > 1;
}

launch::ForkedMain forked_workers_for(const std::vector<std::string>& command) {
  if (command.empty() || env::get("DTORCH_FORK_WORKERS") != std::optional<std::string>("1"))
    return nullptr;
  std::error_code ec;
  std::string program;
  try {
    program = paths::canonical(launch::resolve_program(command.front()), ec);
  } catch (const launch::SpawnError&) {
    return nullptr;  // the launcher says why it cannot run it
  }
  if (ec || program != paths::canonical(paths::executable_path(), ec) || ec) return nullptr;
  return launch::forked_main_of(run_command_line);
}

bool launches_workers(const SelfLaunch& how) {
  return how.nproc_per_node > 1 && !started_by_a_launcher();
}

train::JobSize job_size(const SelfLaunch& how) {
  if (launches_workers(how)) return {1, how.nproc_per_node, how.nproc_per_node};
  const launch::RankInfo me = launch::rank_info_from_env();
  return train::job_size_of(me.world_size, me.local_world_size);
}

bool reports_for_the_job(const SelfLaunch& how) {
  if (launches_workers(how)) return false;  // its workers will
  return launch::rank_info_from_env().rank == 0;
}

std::optional<int> self_launch(const SelfLaunch& how) {
  if (how.nproc_per_node <= 1) return std::nullopt;
  if (started_by_a_launcher()) {
    log::warn("--nproc-per-node is ignored: this process was already started by a launcher");
    return std::nullopt;
  }
  launch::LaunchOptions lo;
  lo.nproc_per_node = how.nproc_per_node;
  lo.standalone = true;
  lo.max_restarts = how.max_restarts;
  lo.log_dir = how.log_dir;
  lo.checkpoint_signal = how.checkpoint_signal;
  if (!how.every_rank) lo.show_ranks = {0};
  lo.prefix_stdout = !how.data_stdout;
  // The same command line without --nproc-per-node: each worker runs as one rank.
  lo.command = {paths::executable_path()};
  const auto& args = command_line();
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--nproc-per-node" || a == "--nproc_per_node") {
      ++i;  // and its value
      continue;
    }
    if (a.rfind("--nproc-per-node=", 0) == 0 || a.rfind("--nproc_per_node=", 0) == 0) continue;
    lo.command.push_back(a);
  }
  lo.forked_main = forked_workers_for(lo.command);
  return launch::run(lo);
}

}  // namespace dtorch::tools
