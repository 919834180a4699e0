// Runs a program as a user would (its own process, stdout and stderr captured to files),
// bounded in time, for tests of the command line.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace dtorch::testing {

/// A running program with stdout and stderr going to DIR/stdout and DIR/stderr.
struct Command {
  pid_t pid = -1;
  std::string dir;
  std::chrono::steady_clock::time_point started;
  /// A `dtorch` command line is a fork of `dtorch`'s fork server, not our child (Note [Fork
  /// server]): its wait status comes on this socket, which finish_command reads and closes.
  int status_fd = -1;
};

struct CommandResult {
  int status = -1;  ///< waitpid status
  std::string out, err;
  double seconds = 0;
  int exit_code() const;
};

/// Starts argv[0] with argv (environment inherited, plus `env` entries "NAME=value"), in the
/// working directory `cwd` (empty: this process's). `dtorch` itself (DTORCH_CLI) is a fork of
/// the `dtorch` fork server that every test of this build shares (Note [Fork server]) unless
/// DTORCH_FORK_WORKERS=0.
Command start_command(const std::string& dir, const std::vector<std::string>& argv,
                      const std::vector<std::string>& env = {}, const std::string& cwd = "");
/// Waits at most `limit` seconds (then kills it and records a test failure).
CommandResult finish_command(const Command& c, double limit = 20);
/// start_command + finish_command in a fresh scratch directory named `name`.
CommandResult run_command(const std::string& name, const std::vector<std::string>& argv,
                          double limit = 20, const std::vector<std::string>& env = {});

/// Whether this build runs under AddressSanitizer (make test SANITIZE=1), whose shadow memory
/// needs terabytes of address space: a command under `ulimit -v` cannot start.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
constexpr bool kAddressSanitizer = __has_feature(address_sanitizer);
#else
constexpr bool kAddressSanitizer = false;
#endif

/// A TCP port on 127.0.0.1 that was free a moment ago.
int free_port();
/// Whether something accepts connections on 127.0.0.1:port.
bool listening(int port);

/// A tiny `dtorch train` run started as rank 1 of 2 whose store is at 127.0.0.1:port, as
/// torchrun's agent would start it (its own --out folder); `env` adds variables or overrides
/// those (later entries win). For tests of what a worker makes of the store it finds.
CommandResult run_second_worker(const std::string& name, int port, double limit,
                                const std::vector<std::string>& env = {});

/// `dtorch launch ARGS`, started like start_command.
Command start_launch(const std::string& dir, std::vector<std::string> args,
                     const std::vector<std::string>& env = {});
/// start_launch + finish_command in a fresh scratch directory named `name`.
CommandResult run_launch(const std::string& name, const std::vector<std::string>& args,
                         double limit = 30);
/// Polls `ready` every 20 ms for at most `limit` seconds; its last answer.
bool wait_until(const std::function<bool()>& ready, double limit);
/// wait_until the file at `path` exists.
bool wait_for_file(const std::string& path, double limit);
/// Alive and not a zombie (a zombie is gone for our purpose, whoever has yet to reap it).
bool alive(pid_t pid);
double seconds_since(std::chrono::steady_clock::time_point t);

std::string read_file(const std::string& path);
bool contains(const std::string& haystack, const std::string& needle);

}  // namespace dtorch::testing
