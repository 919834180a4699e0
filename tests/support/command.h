// Runs a program as a user would (its own process, stdout and stderr captured to files),
// bounded in time, for tests of the command line.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace dtorch::testing {

/// A running program with stdout and stderr going to DIR/stdout and DIR/stderr.
struct Command {
  pid_t pid = -1;
  std::string dir;
  std::chrono::steady_clock::time_point started;
};

struct CommandResult {
  int status = -1;  ///< waitpid status
  std::string out, err;
  double seconds = 0;
  int exit_code() const;
};

/// Starts argv[0] with argv (environment inherited, plus `env` entries "NAME=value").
Command start_command(const std::string& dir, const std::vector<std::string>& argv,
                      const std::vector<std::string>& env = {});
/// Waits at most `limit` seconds (then kills it and records a test failure).
CommandResult finish_command(const Command& c, double limit = 20);
/// start_command + finish_command in a fresh scratch directory named `name`.
CommandResult run_command(const std::string& name, const std::vector<std::string>& argv,
                          double limit = 20, const std::vector<std::string>& env = {});

/// A TCP port on 127.0.0.1 that was free a moment ago.
int free_port();

std::string read_file(const std::string& path);
bool contains(const std::string& haystack, const std::string& needle);

}  // namespace dtorch::testing
