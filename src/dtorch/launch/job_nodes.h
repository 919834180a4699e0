// The nodes of the batch job `dtorch launch` runs in: with one launcher per node (srun
// --ntasks-per-node=1, mpiexec --ppn 1, or a one-node job), the job says how many nodes there
// are, which one this is and where node 0 is, so job scripts need no --nnodes/--node-rank.
#pragma once

#include <optional>
#include <string>

#include "dtorch/launch/launcher.h"

namespace dtorch::launch {

struct JobNodes {
  std::string source;       ///< "Slurm job 42", "Open MPI", ... for the log line
  int nnodes = 1;           ///< nodes in the job, one launcher on each
  int node_rank = 0;        ///< this launcher's node, 0..nnodes-1
  std::string master_addr;  ///< node 0 (127.0.0.1 for a one-node job unless MASTER_ADDR)
  int master_port = 0;      ///< MASTER_PORT, else derived from the job id; 0: any free port
  /// Why this launcher cannot take its node from the job (several launchers per node, or the
  /// batch script of a multi-node job); empty when it can.
  std::string unusable;
};

/// The job this process runs in, read as Note [Launch environment precedence] says; nullopt
/// outside any Slurm, PBS or MPI job, and inside a launched worker (RANK set).
std::optional<JobNodes> job_nodes_from_env();

/// Which of the node flags were given on the command line; given flags always win.
struct GivenNodeFlags {
  bool nnodes = false, node_rank = false, master_addr = false, master_port = false;
};

/// Fills the node fields of `o` that were not given from job_nodes_from_env() (nothing with
/// --standalone or outside a job). Returns a line describing what was filled, empty if nothing.
/// Throws ConfigError when the node count or rank is needed but the job cannot give it.
std::string fill_nodes_from_job(LaunchOptions& o, const GivenNodeFlags& given);

}  // namespace dtorch::launch
