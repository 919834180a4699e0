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

}  // namespace dtorch::tools
