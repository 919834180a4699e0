// MPI launchers' environments -> Detected: Open MPI's mpirun (OMPI_COMM_WORLD_*) and PMI
// (PMI_RANK/PMI_SIZE: MPICH's Hydra mpiexec, Intel MPI, srun --mpi=pmi2).
#include "dtorch/core/env.h"
#include "dtorch/core/error.h"
#include "dtorch/launch/detect.h"

namespace dtorch::launch {
namespace {

struct Names {
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;
};

// Ranks laid out node by node (mpirun's and mpiexec's default): node = rank / ranks per node.
Detected from_vars(const char* source, const Names& n, long rank, long size,
                   std::optional<long> local_rank, std::optional<long> local_size) {
  Detected d;
  d.source = source;
  d.rank_var = n.rank;
  d.world_var = n.size;
  RankInfo& r = d.info;
  r.master_addr.clear();
  r.master_port = 0;
  DTORCH_CHECK_T(ConfigError, size >= 1 && rank >= 0 && rank < size, n.rank, "=", rank,
                 " is not within ", n.size, "=", size);
  r.rank = static_cast<int>(rank);
  r.world_size = static_cast<int>(size);
  d.local_known = local_rank && local_size;
  r.local_rank = static_cast<int>(local_rank.value_or(rank));
  r.local_world_size = static_cast<int>(d.local_known ? *local_size : size);
  DTORCH_CHECK_T(ConfigError,
                 r.local_world_size >= 1 && r.local_rank >= 0 &&
                     r.local_rank < r.local_world_size && r.local_world_size <= r.world_size,
                 n.local_rank, "=", r.local_rank, " and ", n.local_size, "=", r.local_world_size,
                 " do not fit ", n.size, "=", r.world_size);
  r.nnodes = (r.world_size + r.local_world_size - 1) / r.local_world_size;
  r.node_rank = r.rank / r.local_world_size;
  return d;
}

std::optional<long> first_int(std::initializer_list<const char*> names, const char** which) {
  for (const char* n : names) {
    if (auto v = env::get_int(n)) {
      *which = n;
      return v;
    }
  }
  *which = *names.begin();
  return std::nullopt;
}

}  // namespace

std::optional<Detected> detect_open_mpi() {
  Names n{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
          "OMPI_COMM_WORLD_LOCAL_SIZE"};
  auto rank = env::get_int(n.rank);
  auto size = env::get_int(n.size);
  if (!rank && !size) return std::nullopt;
  DTORCH_CHECK_T(ConfigError, rank && size, n.rank, " and ", n.size,
                 " must be set together (Open MPI's mpirun sets both); unset the one left over");
  auto local_rank = env::get_int(n.local_rank);
  auto local_size = env::get_int(n.local_size);
  DTORCH_CHECK_T(ConfigError, local_rank.has_value() == local_size.has_value(), n.local_rank,
                 " and ", n.local_size, " must be set together");
  Detected d = from_vars("Open MPI", n, *rank, *size, local_rank, local_size);
  // Unique to one mpirun, so two jobs on a node derive different ports.
  d.launch_id = env::get("OMPI_MCA_ess_base_jobid").value_or("");
  return d;
}

std::optional<Detected> detect_pmi() {
  auto rank = env::get_int("PMI_RANK");
  auto size = env::get_int("PMI_SIZE");
  if (!rank && !size) return std::nullopt;
  DTORCH_CHECK_T(ConfigError, rank && size,
                 "PMI_RANK and PMI_SIZE must be set together (mpiexec sets both); unset the one "
                 "left over");
  const char* lr_name = nullptr;
  const char* ls_name = nullptr;
  auto local_rank = first_int({"MPI_LOCALRANKID", "PMI_LOCAL_RANK"}, &lr_name);
  auto local_size = first_int({"MPI_LOCALNRANKS", "PMI_LOCAL_SIZE"}, &ls_name);
  Names n{"PMI_RANK", "PMI_SIZE", lr_name, ls_name};
  // Without a local size (srun --mpi=pmi2 sets none) the local ranks come from Slurm, or
  // detect_scheduler assumes one node.
  if (!local_size) local_rank.reset();
  return from_vars("PMI (mpiexec)", n, *rank, *size, local_rank, local_size);
}

}  // namespace dtorch::launch
