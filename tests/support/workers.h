// Multi-rank tests: a test registers a worker function by name, and run_ranks() starts N real
// processes of this test binary (through dtorch's launcher, over Gloo on 127.0.0.1), each
// running that worker with torchrun's environment set.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace dtorch::testing {

using WorkerFn = std::function<void(const std::vector<std::string>& args)>;

/// Registers `fn` under `name`; use through DTORCH_TEST_WORKER.
bool register_worker(const std::string& name, WorkerFn fn);

/// If argv asks for a worker (--dtorch-worker NAME ARGS...), runs it and returns its exit
/// code (0, or 1 when it threw); otherwise returns -1.
int maybe_run_worker(int argc, char** argv);

/// Forks the rank server that run_ranks() starts ranks from (Note [Forked workers]): call
/// first thing in main(), while this process is one thread that has run nothing.
void start_rank_server();

/// Runs `n` ranks of worker `name` with `args` and returns the launcher's exit code. The
/// launcher ends the ranks after `timeout_seconds`, which must be positive: a test never waits
/// without a bound.
int run_ranks(int n, const std::string& name, const std::vector<std::string>& args = {},
              double timeout_seconds = 120);

/// A fresh empty directory under the build tree's test scratch space.
std::string scratch_dir(const std::string& name);

}  // namespace dtorch::testing

#define DTORCH_TEST_WORKER(name)                                          \
  static void dtorch_worker_##name(const std::vector<std::string>& args); \
  static const bool dtorch_worker_registered_##name =                     \
      ::dtorch::testing::register_worker(#name, dtorch_worker_##name);    \
  static void dtorch_worker_##name(const std::vector<std::string>& args)
