// The `dtorch` command line: each subcommand adds itself to the app from its own file.
#pragma once

#include <CLI/CLI.hpp>

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "dtorch/core/enum_names.h"
#include "dtorch/launch/process.h"
#include "dtorch/launch/signals.h"
#include "dtorch/train/config/job_size.h"

namespace dtorch::train {
inline namespace config {
struct StrategyConfig;
struct LoaderConfig;
struct ParallelismConfig;
struct TrainConfig;
}  // namespace config
}  // namespace dtorch::train

namespace dtorch::tools {

/// The process's own argv, for subcommands that re-launch themselves.
const std::vector<std::string>& command_line();
void set_command_line(int argc, char** argv);
/// The whole `dtorch` command line: what main() runs, a forked worker (self_launch.cpp) and a
/// fork server's fork (Note [Forked workers], Note [Fork server]).
int run_command_line(int argc, char** argv);

/// `dtorch launch [flags] -- PROGRAM [ARGS...]` (cmd_launch.cpp)
void add_launch_command(CLI::App& app, int& exit_code);
/// The flags of the run configuration's fields (train/config/run_config.h) as options of `cmd`
/// writing into the struct given, grouped by section, its values when called the defaults
/// shown (config_options.cpp): the strategy's, the data loader's, or every setting of a run.
void add_strategy_options(CLI::App* cmd, train::StrategyConfig& s);
void add_loader_options(CLI::App* cmd, train::LoaderConfig& l);
void add_parallelism_options(CLI::App* cmd, train::ParallelismConfig& p);
void add_config_options(CLI::App* cmd, train::TrainConfig& c);
/// An option `name` taking one of the names of enum E (Note [Closed sets]) into `value`, its
/// value when called shown as the default.
template <class E>
CLI::Option* add_choice_option(CLI::App* cmd, const std::string& name, E& value,
                               const std::string& doc) {
  return cmd
      ->add_option_function<std::string>(
          name, [&value](const std::string& s) { value = *value_named<E>(s); }, doc)
      ->check(CLI::IsMember(names_of<E>()))
      ->default_str(name_of(value));
}
/// `dtorch train ...` (cmd_train.cpp)
void add_train_command(CLI::App& app, int& exit_code);
/// `dtorch bench ddp ...` (cmd_bench.cpp)
void add_bench_command(CLI::App& app, int& exit_code);
/// `dtorch bench memory ...` (cmd_bench_memory.cpp), under `bench`.
void add_bench_memory_command(CLI::App& bench, int& exit_code);
/// `dtorch bench checkpoint` (cmd_bench_checkpoint.cpp).
void add_bench_checkpoint_command(CLI::App& bench, int& exit_code);
/// `dtorch bench data ...` (cmd_bench_data.cpp), under `bench`.
void add_bench_data_command(CLI::App& bench, int& exit_code);
/// `dtorch bench optimizer ...` (cmd_bench_optimizer.cpp), under `bench`.
void add_bench_optimizer_command(CLI::App& bench, int& exit_code);
/// How `dtorch train` or `dtorch bench ...` starts its own workers (self_launch.cpp).
struct SelfLaunch {
  int nproc_per_node = 1;
  bool every_rank = true;    ///< show every rank's output, or rank 0's only
  bool data_stdout = false;  ///< stdout is data (JSON lines): not prefixed with [n<node> r<rank>]
  int max_restarts = 0;
  std::string log_dir;
  /// Passed on to the workers (Note [Checkpoint on a signal]); off for commands that do not
  /// checkpoint.
  launch::CheckpointSignal checkpoint_signal = launch::CheckpointSignal::Off;
};
/// Note [Self-launch]: runs this command line on `nproc_per_node` local workers through the
/// launcher and returns its exit code; nullopt when this process should run as one rank
/// itself (one process asked for, or already a rank of a job).
std::optional<int> self_launch(const SelfLaunch& how);
/// Note [Forked workers]: the function a launcher forks its workers into when they run `command`
/// and the test suite asked for forks (DTORCH_FORK_WORKERS=1), `command` being this very program;
/// else none, and the launcher exec's them.
launch::ForkedMain forked_workers_for(const std::vector<std::string>& command);
/// Whether self_launch will start workers rather than this process running as a rank.
bool launches_workers(const SelfLaunch& how);
/// Whether a launcher (torchrun, dtorch launch, srun, mpirun, qsub) started this process.
bool started_by_a_launcher();
/// The job's size as this process can tell before any rank starts: one node of
/// `nproc_per_node` when self_launch will start the workers, else the launch environment's.
train::JobSize job_size(const SelfLaunch& how);
/// Whether this process should print the job's one-time messages: rank 0 of the job, not the
/// process that only starts the workers.
bool reports_for_the_job(const SelfLaunch& how);
/// The long names ("--lr") of the options of `cmd` given on its command line, option groups
/// included.
std::set<std::string> flags_given(const CLI::App& cmd);
/// self_launch for `dtorch bench ...`: stdout is JSON lines; rank 0's only unless every_rank.
std::optional<int> self_launch_bench(int nproc_per_node, bool every_rank);
/// `dtorch checkpoint inspect|consolidate DIR ...` (cmd_checkpoint.cpp)
void add_checkpoint_command(CLI::App& app, int& exit_code);
/// `dtorch pipeline show ...` (cmd_pipeline.cpp)
void add_pipeline_command(CLI::App& app, int& exit_code);
/// `dtorch plan ...` and `dtorch plan calibrate` (cmd_plan.cpp)
void add_plan_command(CLI::App& app, int& exit_code);
/// `dtorch plot RUN_DIR... --out FILE` (cmd_plot.cpp)
void add_plot_command(CLI::App& app, int& exit_code);

}  // namespace dtorch::tools
