// The launcher behind `dtorch launch`: starts nproc_per_node workers of one program with
// torchrun's environment, prefixes their output with node and rank, watches them, and tears
// the whole group down (and optionally restarts it) when one fails.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "dtorch/launch/process.h"
#include "dtorch/launch/rdzv_options.h"
#include "dtorch/launch/signals.h"

namespace dtorch::launch {

struct LaunchOptions {
  int nproc_per_node = 1;  ///< workers started on this node
  int nnodes = 1;          ///< nodes in the job (with c10d: at most)
  int node_rank = 0;       ///< this node's index, 0..nnodes-1 (static only)
  /// Static: --node-rank and --master-addr/--master-port. C10d: the launchers meet at
  /// rdzv_endpoint, are numbered on arrival and go on with min_nodes..nnodes nodes.
  RdzvBackend rdzv_backend = RdzvBackend::Static;
  int min_nodes = 0;       ///< c10d: fewer nodes than this end the job (0: nnodes)
  Endpoint rdzv_endpoint;  ///< c10d: host and port of the store the launchers meet in
  RdzvConf rdzv_conf;      ///< c10d: timeouts and heartbeats (--rdzv-conf)
  std::string master_addr = "127.0.0.1";  ///< host of node 0, where the store is served
  int master_port = 29500;                ///< store port on master_addr
  /// Where a store this launcher serves listens: auto, all or an address (Note [Where the
  /// store listens]).
  std::string rdzv_listen = "auto";
  bool standalone = false;  ///< single node on a free port (ignores master_addr/port)
  int max_restarts = 0;     ///< restarts of the whole group after a worker failure
  /// Global ranks whose output is shown; empty shows every rank.
  std::vector<int> show_ranks;
  /// Prefix the workers' stdout lines with [n<node> r<rank>] as their stderr's; off for
  /// programs whose stdout is data (dtorch bench's JSON lines, for jq).
  bool prefix_stdout = true;
  /// The signal that asks the workers to checkpoint and stop (Note [Checkpoint on a signal]):
  /// passed on to them, and a group that then exits kCheckpointedExitCode exits with it.
  CheckpointSignal checkpoint_signal = CheckpointSignal::Usr1;
  /// Then `scontrol requeue $SLURM_JOB_ID` (node 0), so that the job runs again and resumes.
  bool requeue_on_signal = false;
  /// Seconds between SIGTERM and SIGKILL when the group is torn down.
  double grace_seconds = 3.0;
  /// Seconds the rendezvous store waits for all nodes' workers to connect.
  double rdzv_timeout_seconds = 300.0;
  /// Tear the group down and fail when it runs longer than this (0: no limit).
  double timeout_seconds = 0;
  std::vector<std::string> command;        ///< PROGRAM ARGS...
  std::map<std::string, std::string> env;  ///< extra variables for every worker
  /// TORCHELASTIC_RUN_ID for the workers; empty: a fresh random id with standalone, else "none"
  /// (torchrun's defaults).
  std::string run_id;
  /// When set, each worker's output also goes to LOG_DIR/rank<global rank>.log (stdout and
  /// stderr, unprefixed, restarts appended). See Note [Log files].
  std::string log_dir;
  /// When set, each worker is a fork of this process running forked_main(command) instead of
  /// an exec of `command`: for tests, Note [Forked workers].
  ForkedMain forked_main;
};

/// Runs the group to completion and returns the exit code `dtorch launch` should exit with:
/// 0 when every worker exited 0, otherwise non-zero after naming the failed rank, its exit
/// code or signal. Throws ConfigError for bad options.
int run(const LaunchOptions& opts);

}  // namespace dtorch::launch
