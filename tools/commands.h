// The `dtorch` command line: each subcommand adds itself to the app from its own file.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace dtorch::tools {

/// The process's own argv, for subcommands that re-launch themselves.
const std::vector<std::string>& command_line();
void set_command_line(int argc, char** argv);

/// `dtorch launch [flags] -- PROGRAM [ARGS...]` (cmd_launch.cpp)
void add_launch_command(CLI::App& app, int& exit_code);
/// `dtorch train ...` (cmd_train.cpp)
void add_train_command(CLI::App& app, int& exit_code);
/// `dtorch bench ddp ...` (cmd_bench.cpp)
void add_bench_command(CLI::App& app, int& exit_code);
/// `dtorch bench memory ...` (cmd_bench_memory.cpp), under `bench`.
void add_bench_memory_command(CLI::App& bench, int& exit_code);
/// Runs `dtorch bench <sub>` with this process's arguments on n local ranks through the
/// launcher; every rank's output shown, or rank 0's only.
int relaunch_bench(const std::string& sub, int n, bool every_rank);
/// `dtorch checkpoint inspect|consolidate DIR ...` (cmd_checkpoint.cpp)
void add_checkpoint_command(CLI::App& app, int& exit_code);
/// `dtorch pipeline show ...` (cmd_pipeline.cpp)
void add_pipeline_command(CLI::App& app, int& exit_code);

}  // namespace dtorch::tools
