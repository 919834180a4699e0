// Where this process sits in the job: its rank, its node, and where the rendezvous is.
// Read from whichever launcher started it (torchrun, `dtorch launch`, mpirun, srun, PBS).
#pragma once

#include <string>

namespace dtorch::launch {

struct RankInfo {
  int rank = 0;              ///< global rank, 0..world_size-1 (RANK)
  int local_rank = 0;        ///< rank on this node (LOCAL_RANK)
  int world_size = 1;        ///< all ranks in the job (WORLD_SIZE)
  int local_world_size = 1;  ///< ranks on this node (LOCAL_WORLD_SIZE)
  int node_rank = 0;         ///< index of this node (GROUP_RANK, else rank / local_world_size)
  int nnodes = 1;            ///< node count (world_size / local_world_size)
  std::string master_addr = "127.0.0.1";  ///< rendezvous host (MASTER_ADDR)
  int master_port = 29500;                ///< rendezvous port (MASTER_PORT)
  int restart_count =
      0;  ///< how often the launcher restarted the group (TORCHELASTIC_RESTART_COUNT)
  /// The launcher (torchrun's agent, or `dtorch launch`) already serves the rendezvous store
  /// at master_addr:master_port (TORCHELASTIC_USE_AGENT_STORE=True): connect as a client.
  bool launcher_hosts_store = false;
  /// The job's run id (TORCHELASTIC_RUN_ID, --rdzv-id); "" without a launcher. Note [One job per
  /// store] in launch/store.h.
  std::string run_id;
};

/// Reads the launch environment: torchrun's variables, else Open MPI's, Cray PALS's, PMI's or
/// Slurm's, with the master address from MASTER_ADDR or the job's first host (see Note [Launch
/// environment precedence] in detect.h). With none set: a single process (world size 1). A
/// partial, inconsistent or conflicting set (RANK without WORLD_SIZE, RANK >= WORLD_SIZE,
/// RANK=1 next to SLURM_PROCID=3, ...) is a ConfigError that names the variables.
RankInfo rank_info_from_env();

}  // namespace dtorch::launch
