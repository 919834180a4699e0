// PBS's environment -> JobAllocation (the hosts in PBS_NODEFILE), and Cray PALS, the mpiexec of
// HPE/Cray systems run under PBS (NCAR's Derecho, ALCF's Polaris and Aurora) -> Detected.
#include <fstream>

#include "dtorch/core/env.h"
#include "dtorch/core/error.h"
#include "dtorch/core/input_file.h"
#include "dtorch/launch/detect.h"

namespace dtorch::launch {

std::optional<JobAllocation> pbs_allocation() {
  auto nodefile = env::get("PBS_NODEFILE");
  auto id = env::get("PBS_JOBID");
  if (!nodefile && !id) return std::nullopt;
  JobAllocation a;
  a.scheduler = "PBS";
  a.job_id = id.value_or("");
  if (nodefile) {
    const std::string problem = input_file_problem(*nodefile, kMaxTextFileBytes);
    DTORCH_CHECK_T(ConfigError, problem.empty(), "PBS_NODEFILE=", *nodefile, ": ", problem,
                   "; run inside the PBS job that wrote it, or unset PBS_NODEFILE");
    std::ifstream in(*nodefile);
    // One line per MPI slot (chunk x mpiprocs); the hosts are the distinct lines, in order.
    for (std::string line; std::getline(in, line);) {
      auto end = line.find_last_not_of(" \t\r");
      line = end == std::string::npos ? "" : line.substr(0, end + 1);
      if (line.empty()) continue;
      bool seen = false;
      for (const auto& h : a.hosts)
        seen = seen || h == line;
      if (!seen) a.hosts.push_back(line);
    }
    DTORCH_CHECK_T(ConfigError, !a.hosts.empty(), "PBS_NODEFILE=", *nodefile, " lists no hosts");
  }
  a.nnodes = static_cast<int>(a.hosts.size());
  return a;
}

std::optional<Detected> detect_pals() {
  auto rank = env::get_int("PALS_RANKID");
  if (!rank) return std::nullopt;
  // PALS gives the rank and node; the world and local sizes come from Cray PMI next to it.
  auto size = env::get_int("PMI_SIZE");
  DTORCH_CHECK_T(ConfigError, size, "PALS_RANKID=", *rank,
                 " is set but PMI_SIZE is not, so the number of ranks is unknown; start the ranks "
                 "with PALS's mpiexec (which sets both), or set WORLD_SIZE and RANK yourself");
  auto local_rank = env::get_int("PALS_LOCAL_RANKID");
  if (!local_rank) local_rank = env::get_int("PMI_LOCAL_RANK");
  auto local_size = env::get_int("PALS_LOCAL_SIZE");
  const char* local_size_var = "PALS_LOCAL_SIZE";
  if (!local_size) {
    local_size = env::get_int("PMI_LOCAL_SIZE");
    local_size_var = "PMI_LOCAL_SIZE";
  }
  Detected d;
  d.source = "Cray PALS";
  d.rank_var = "PALS_RANKID";
  d.world_var = "PMI_SIZE";
  RankInfo& r = d.info;
  r.master_addr.clear();
  r.master_port = 0;
  r.rank = static_cast<int>(*rank);
  r.world_size = static_cast<int>(*size);
  DTORCH_CHECK_T(ConfigError, r.world_size >= 1 && r.rank >= 0 && r.rank < r.world_size,
                 "PALS_RANKID=", r.rank, " is not within PMI_SIZE=", r.world_size);
  d.local_known = local_rank && local_size;
  r.local_rank = static_cast<int>(local_rank.value_or(r.rank));
  r.local_world_size = static_cast<int>(d.local_known ? *local_size : r.world_size);
  DTORCH_CHECK_T(ConfigError,
                 r.local_world_size >= 1 && r.local_rank >= 0 &&
                     r.local_rank < r.local_world_size && r.local_world_size <= r.world_size,
                 "PALS_LOCAL_RANKID=", r.local_rank, " and ", local_size_var, "=",
                 r.local_world_size, " do not fit PMI_SIZE=", r.world_size);
  r.nnodes = (r.world_size + r.local_world_size - 1) / r.local_world_size;
  r.node_rank = static_cast<int>(env::get_int("PALS_NODEID").value_or(r.rank / r.local_world_size));
  DTORCH_CHECK_T(ConfigError, r.node_rank >= 0 && r.node_rank < r.nnodes,
                 "PALS_NODEID=", r.node_rank, " is not within the ", r.nnodes,
                 " nodes that PMI_SIZE=", r.world_size, " ranks at ", local_size_var, "=",
                 r.local_world_size, " fill");
  d.launch_id = env::get("PALS_APID").value_or("");
  return d;
}

}  // namespace dtorch::launch
