// rank_info_from_env: runs the detectors of detect.h in the order of Note [Launch environment
// precedence], checks that the environments present agree, and resolves the rendezvous address.
#include "dtorch/launch/rank_info.h"

#include <cctype>

#include "dtorch/core/env.h"
#include "dtorch/core/error.h"
#include "dtorch/core/log.h"
#include "dtorch/launch/detect.h"

namespace dtorch::launch {
namespace {

// MASTER_ADDR, else 127.0.0.1 for one node, else the first host of the job (where mpirun,
// mpiexec and srun put rank 0). MASTER_PORT, else a port derived from the launch or job id.
void resolve_master(Detected& d, const std::optional<JobAllocation>& job) {
  RankInfo& r = d.info;
  const MasterEnv master = master_from_env();
  if (master.addr) {
    r.master_addr = *master.addr;
  } else if (r.nnodes == 1) {
    r.master_addr = "127.0.0.1";
  } else {
    DTORCH_CHECK_T(ConfigError, job && !job->hosts.empty(), d.source, " runs ", r.world_size,
                   " ranks on ", r.nnodes, " nodes (", d.world_var, "=", r.world_size,
                   "), but no MASTER_ADDR is set and no Slurm or PBS job names the hosts; "
                   "export MASTER_ADDR=<host of rank 0> (and MASTER_PORT) before starting the "
                   "ranks, e.g. `mpirun -x MASTER_ADDR=$(hostname) ...`");
    r.master_addr = job->hosts.front();
  }
  if (master.port) {
    r.master_port = *master.port;
  } else if (!d.launch_id.empty()) {
    r.master_port = port_from_job_id(d.launch_id);
  } else if (job && !job->job_id.empty()) {
    r.master_port = port_from_job_id(job->job_id);
  } else {
    r.master_port = 29500;  // torchrun's default
  }
}

}  // namespace

MasterEnv master_from_env() {
  MasterEnv m;
  m.addr = env::get("MASTER_ADDR");
  if (auto p = env::get_int("MASTER_PORT")) {
    DTORCH_CHECK_T(ConfigError, *p > 0 && *p < 65536, "MASTER_PORT=", *p,
                   " is not a TCP port (1..65535); export the port rank 0 listens on");
    m.port = static_cast<int>(*p);
  }
  return m;
}

int port_from_job_id(const std::string& id) {
  std::string head = id.substr(0, id.find('.'));
  bool numeric = !head.empty() && head.size() <= 18;
  for (char c : head)
    numeric = numeric && std::isdigit(static_cast<unsigned char>(c));
  unsigned long long n = 0;
  if (numeric) {
    n = std::stoull(head);
  } else {
    n = 1469598103934665603ULL;  // FNV-1a
    for (unsigned char c : id)
      n = (n ^ c) * 1099511628211ULL;
  }
  return 20000 + static_cast<int>(n % 10000);
}

std::optional<Detected> detect_scheduler() {
  std::optional<Detected> d = detect_open_mpi();
  if (!d) d = detect_pals();
  if (!d) d = detect_pmi();
  bool from_mpi = d.has_value();
  if (!d) d = detect_slurm();
  if (!d) return std::nullopt;
  if (!d->local_known) {
    // srun --mpi=pmi2 sets PMI_RANK/PMI_SIZE but no local ranks; Slurm's describe the same task.
    auto s = detect_slurm();
    if (s && s->info.rank == d->info.rank && s->info.world_size == d->info.world_size) {
      d->info.local_rank = s->info.local_rank;
      d->info.local_world_size = s->info.local_world_size;
      d->info.node_rank = s->info.node_rank;
      d->info.nnodes = s->info.nnodes;
      d->local_known = true;
    }
  }
  // Slurm ranks live in Slurm's job; MPI ranks in whichever job mpirun/mpiexec runs in.
  std::optional<JobAllocation> job = slurm_allocation();
  if (from_mpi && !job) job = pbs_allocation();
  if (!d->local_known) {
    DTORCH_CHECK_T(ConfigError, !job || job->nnodes <= 1, d->source, " gives ", d->rank_var,
                   " and ", d->world_var, " but no local rank, and the ", job->scheduler,
                   " job spans ", job->nnodes, " nodes, so the ranks sharing a node are unknown; ",
                   "set LOCAL_RANK, LOCAL_WORLD_SIZE, RANK, WORLD_SIZE, MASTER_ADDR and "
                   "MASTER_PORT yourself, or start the ranks with srun or mpirun");
  }
  resolve_master(*d, job);
  return d;
}

RankInfo rank_info_from_env() {
  std::optional<Detected> torchrun = detect_torchrun();
  // A launcher's own variables are not compared with the scheduler's (its task runs many ranks).
  if (torchrun && torchrun->set_by_launcher) {
    log::debug("launch environment: ", torchrun->source, " from a launcher, rank ",
               torchrun->info.rank, " of ", torchrun->info.world_size);
    return torchrun->info;
  }
  std::optional<Detected> sched = detect_scheduler();
  if (torchrun) {
    // Note [Launch environment precedence]: hand-exported torchrun variables must agree.
    if (sched && torchrun->info.world_size == sched->info.world_size) {
      DTORCH_CHECK_T(ConfigError, torchrun->info.rank == sched->info.rank,
                     "RANK=", torchrun->info.rank, " but ", sched->rank_var, "=", sched->info.rank,
                     " (WORLD_SIZE=", torchrun->info.world_size, " and ", sched->world_var,
                     " agree): the two disagree on this process's rank. RANK "
                     "was probably exported once in the job script and so is the same in every "
                     "task; unset RANK and WORLD_SIZE and let dtorch read ",
                     sched->source, "'s variables, or set RANK per task");
    }
    log::debug("launch environment: ", torchrun->source,
               sched ? " (inside " + sched->source + ")" : std::string(), ", rank ",
               torchrun->info.rank, " of ", torchrun->info.world_size);
    return torchrun->info;
  }
  if (auto world = env::get_int("WORLD_SIZE")) {
    DTORCH_CHECK_T(ConfigError, sched, "RANK and WORLD_SIZE must be set together (RANK=-1",
                   ", WORLD_SIZE=", *world,
                   "); start the program with `dtorch launch` or torchrun, or unset both");
    DTORCH_CHECK_T(ConfigError, *world == sched->info.world_size, "WORLD_SIZE=", *world, " but ",
                   sched->world_var, "=", sched->info.world_size, ": ", sched->source,
                   " starts a different number of ranks than WORLD_SIZE says; ",
                   "unset WORLD_SIZE (dtorch reads ", sched->world_var,
                   "), or start as many ranks as it says");
  }
  if (!sched) {
    auto ntasks = env::get_int("SLURM_NTASKS");
    if (ntasks && *ntasks > 1 && env::get("SLURM_JOB_ID")) {
      // Slurm ranks exist only in srun's tasks (Note [Launch environment precedence]).
      log::warn("running as a single process in the batch script of Slurm job ",
                *env::get("SLURM_JOB_ID"), " (SLURM_NTASKS=", *ntasks, "); to run ", *ntasks,
                " ranks, start them with srun, e.g. `srun dtorch train ...`");
    }
    log::debug("launch environment: none, a single process");
    return RankInfo{};
  }
  const RankInfo& r = sched->info;
  log::debug("launch environment: ", sched->source, " (", sched->rank_var, "=", r.rank, ", ",
             sched->world_var, "=", r.world_size, "), local rank ", r.local_rank, " of ",
             r.local_world_size, " on node ", r.node_rank, " of ", r.nnodes, ", master ",
             r.master_addr, ":", r.master_port);
  return sched->info;
}

}  // namespace dtorch::launch
