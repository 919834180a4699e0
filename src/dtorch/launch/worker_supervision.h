// Worker supervision: one start of a node's workers (an attempt), watched until every worker
// has ended: their output relayed, a failed worker's group torn down, and the verdict returned.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "dtorch/launch/launcher.h"
#include "dtorch/launch/launcher_output.h"
#include "dtorch/launch/signals.h"

namespace dtorch::launch {

// Everything that is the same for every attempt.
struct Plan {
  LaunchOptions opts;  // an elastic job's rounds each set node_rank and nnodes
  std::string program_path;
  std::string master_addr;
  int master_port = 0;
  int world_size = 0;
  std::string run_id;
  std::map<std::string, std::string> env;  // launcher env + opts.env (+ OMP_NUM_THREADS)
  std::string host;  // in the line prefix of jobs on several nodes; empty on one node
  const RankLogs* logs = nullptr;
  std::string error_dir;  // TORCHELASTIC_ERROR_FILE lives under it
  /// TORCHELASTIC_USE_AGENT_STORE: the launcher serves the workers' store (else rank 0 does).
  bool agent_store = true;
  int round = -1;  // an elastic job's round (DTORCH_ELASTIC_ROUND); -1 for a static job
  /// With opts.forked_main: the forks made as the launcher started (Note [Forked workers]).
  WorkerForks* forks = nullptr;
};

struct Failure {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = 0;
  int status = 0;
  std::string hidden_err_tail;
  std::string error_file;
};

// RoundEnded: the watch (an elastic job's rendezvous) asked the workers to stop. Checkpointed:
// every worker ended well, some after checkpointing on the checkpoint signal (Note [Checkpoint
// on a signal]).
enum class End { Success, WorkerFailed, Signalled, TimedOut, RoundEnded, Checkpointed };

struct AttemptEnd {
  End how = End::Success;
  Failure failure;  // End::WorkerFailed
  int signal = 0;   // End::Signalled
};

/// Starts the workers of `plan` for restart `attempt` and watches them until every one has
/// ended. `watch`, when given, is asked about twice a second whether to stop the workers.
/// Whatever way it leaves (a SpawnError included), no worker and nothing a worker started is
/// left behind.
AttemptEnd run_attempt(const Plan& plan, int attempt, Console& console, SignalWatch& signals,
                       std::optional<std::chrono::steady_clock::time_point> deadline,
                       std::function<bool()> watch = nullptr);

/// What the launcher says about a failed worker: who, how it ended, its error file, and the end
/// of its stderr when --show-ranks hid it.
std::string describe_failure(const Plan& plan, const Failure& f);

}  // namespace dtorch::launch
