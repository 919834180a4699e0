// Where this process sits, as each launcher or batch system tells it: one small detector per
// environment (detect_*.cpp), each giving the same RankInfo, and the order they are tried in.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "dtorch/launch/rank_info.h"

namespace dtorch::launch {

// Note [Launch environment precedence]
// A process may see several launchers' variables at once: `dtorch launch` or torchrun inside
// a Slurm task, mpirun inside a Slurm or PBS job, srun's PMI plugin next to SLURM_*. The
// innermost launcher started this process, so it speaks for it:
//   1. torchrun's RANK/WORLD_SIZE/... (also set by `dtorch launch`);
//   2. MPI launchers: Open MPI (OMPI_COMM_WORLD_*), then Cray PALS (PALS_RANKID + PMI_SIZE),
//      then PMI (PMI_RANK/PMI_SIZE: MPICH's Hydra, Intel MPI, srun --mpi=pmi2);
//   3. Slurm (SLURM_PROCID, ... in a job step started by srun; not in the batch script itself,
//      which is one process whatever SLURM_NTASKS says);
//   4. PBS (PBS_NODEFILE, PBS_JOBID), which gives the job's hosts but no ranks.
// The outer environments still supply what the inner one lacks: the master address is the first
// host of the Slurm node list or the PBS node file when MASTER_ADDR is not set, and the port is
// derived from the launch's or job's id when MASTER_PORT is not set (port_from_job_id).
// Disagreements are errors rather than guesses:
//   - torchrun variables not written by a launcher (no TORCHELASTIC_RUN_ID or GROUP_RANK) whose
//     WORLD_SIZE equals the scheduler's must carry its rank too: RANK=0 with SLURM_PROCID=3 is
//     `export RANK=$SLURM_PROCID` run once in the batch script and then shared by every task;
//   - WORLD_SIZE without RANK is accepted next to a scheduler only when the two sizes agree;
//   - each detector rejects its own partial or inconsistent sets (SLURM_PROCID without
//     SLURM_NTASKS, a rank outside the world, a node list that does not match SLURM_NNODES).
// When torchrun's world differs from the scheduler's, the scheduler's task is a launcher that
// runs several ranks, and the two are not compared.

/// One environment's account of this process.
struct Detected {
  std::string source;     ///< the environment, for logs and errors: "Slurm", "Open MPI", ...
  std::string rank_var;   ///< the variable that gave the rank (SLURM_PROCID), for messages
  std::string world_var;  ///< the variable that gave the world size (SLURM_NTASKS)
  /// The place; master_addr is empty and master_port 0 where the environment names none.
  RankInfo info;
  /// local_rank, local_world_size and node_rank came from the environment (not assumed).
  bool local_known = true;
  /// torchrun variables written by a launcher (TORCHELASTIC_RUN_ID or GROUP_RANK present).
  bool set_by_launcher = false;
  /// An id unique to this launch (Open MPI job id, PALS application id), for the port.
  std::string launch_id;
};

/// What a batch system says about the job as a whole, whichever process asks.
struct JobAllocation {
  std::string scheduler;           ///< "Slurm" or "PBS"
  std::string job_id;              ///< SLURM_JOB_ID or PBS_JOBID
  std::vector<std::string> hosts;  ///< the job's (or job step's) hosts; rank 0 runs on hosts[0]
  int nnodes = 0;                  ///< hosts.size(), or SLURM_JOB_NUM_NODES without a list
};

// Each detector returns nullopt when its variables are absent, and throws ConfigError naming
// the variables when they are present but partial or inconsistent.
std::optional<Detected> detect_torchrun();  // RANK, WORLD_SIZE, LOCAL_RANK, ... (RANK decides)
std::optional<Detected> detect_open_mpi();  // OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE
std::optional<Detected> detect_pals();      // PALS_RANKID, PALS_LOCAL_RANKID, PALS_NODEID, ...
std::optional<Detected> detect_pmi();       // PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, ...
std::optional<Detected> detect_slurm();     // SLURM_PROCID, SLURM_NTASKS, ... in a job step
std::optional<JobAllocation> slurm_allocation();  // SLURM_JOB_ID, SLURM_JOB_NODELIST
std::optional<JobAllocation> pbs_allocation();    // PBS_NODEFILE, PBS_JOBID

/// The first of the MPI launchers and Slurm that is present (see Note [Launch environment
/// precedence]), with local ranks filled in from Slurm where the MPI one lacks them, and the
/// master address and port resolved. nullopt outside any of them.
std::optional<Detected> detect_scheduler();

/// MASTER_ADDR and MASTER_PORT as the environment gives them, read in this one place: unset is
/// nullopt; a MASTER_PORT that is not a TCP port (1..65535) is a ConfigError naming it. Each
/// launch environment decides what an unset one means.
struct MasterEnv {
  std::optional<std::string> addr;
  std::optional<int> port;
};
MasterEnv master_from_env();

/// A rendezvous port every process of one job derives alike: 20000 + id % 10000 for a numeric
/// id (PBS's "1234.server" counts as 1234), a hash of the id otherwise. Below Linux's ephemeral
/// range (32768+), so it does not collide with outgoing connections.
int port_from_job_id(const std::string& id);

}  // namespace dtorch::launch
