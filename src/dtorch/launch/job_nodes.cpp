// job_nodes_from_env: one launcher per node, as Slurm, PBS or an MPI launcher describes it. Uses
// the same detectors as rank_info_from_env, reading each launcher task as one node.
#include "dtorch/launch/job_nodes.h"

#include "dtorch/core/env.h"
#include "dtorch/core/error.h"
#include "dtorch/launch/detect.h"

namespace dtorch::launch {
namespace {

JobNodes one_node(const std::string& source) {
  JobNodes j;
  j.source = source;
  const MasterEnv master = master_from_env();
  j.master_addr = master.addr.value_or("127.0.0.1");
  j.master_port = master.port.value_or(0);
  return j;
}

}  // namespace

std::optional<JobNodes> job_nodes_from_env() {
  if (env::get("RANK")) return std::nullopt;  // a worker of some launcher already
  if (auto d = detect_scheduler()) {
    const RankInfo& r = d->info;
    std::string source = d->source + " (" + d->rank_var + "=" + std::to_string(r.rank) + ", " +
                         d->world_var + "=" + std::to_string(r.world_size) + ")";
    if (r.world_size == 1) return one_node(source);
    JobNodes j;
    j.source = source;
    j.nnodes = r.world_size;
    j.node_rank = r.rank;
    j.master_addr = r.master_addr;
    j.master_port = r.master_port;
    if (r.local_world_size != 1) {
      j.unusable = str(d->source, " started ", r.local_world_size, " copies of `dtorch launch` ",
                       "on this node (", r.world_size, " on ", r.nnodes, " nodes), but it must ",
                       "run once per node and start the ranks itself: use srun ",
                       "--ntasks-per-node=1, mpirun --npernode 1 or mpiexec --ppn 1, or give ",
                       "--nnodes and --node-rank");
    }
    return j;
  }
  // The batch script itself (or an salloc shell): one node, or it cannot speak for the others.
  std::optional<JobAllocation> job = slurm_allocation();
  if (!job) job = pbs_allocation();
  if (!job) return std::nullopt;
  std::string source = job->scheduler + " job " + job->job_id;
  JobNodes j = one_node(source);
  if (job->nnodes > 1) {
    j.nnodes = job->nnodes;
    j.unusable =
        str("`dtorch launch` runs in the batch script of ", source, ", which has ", job->nnodes,
            " nodes, so only this node would train; start it once per node: `srun ",
            "--ntasks-per-node=1 dtorch launch ...` (Slurm) or `mpiexec -n ", job->nnodes,
            " --ppn 1 dtorch launch ...` (PBS), or give --nnodes and --node-rank");
  }
  return j;
}

std::string fill_nodes_from_job(LaunchOptions& o, const GivenNodeFlags& given) {
  if (o.standalone) return "";
  if (given.nnodes && given.node_rank && given.master_addr && given.master_port) return "";
  std::optional<JobNodes> j = job_nodes_from_env();
  if (!j) return "";
  bool needs_nodes = !given.nnodes || !given.node_rank;
  DTORCH_CHECK_T(ConfigError, j->unusable.empty() || !needs_nodes, j->unusable);
  if (!j->unusable.empty()) return "";  // --nnodes and --node-rank given: the flags decide
  if (!given.nnodes) o.nnodes = j->nnodes;
  if (!given.node_rank) o.node_rank = j->node_rank;
  // An address derived for a one-node job would not suit a multi-node --nnodes, and vice versa.
  bool same_shape = o.nnodes == j->nnodes;
  if (!given.master_addr && same_shape) o.master_addr = j->master_addr;
  if (!given.master_port && same_shape) o.master_port = j->master_port;
  return str("nodes from ", j->source, ": node ", o.node_rank, " of ", o.nnodes, ", master ",
             o.master_addr, ":",
             o.master_port == 0 ? std::string("<free port>") : std::to_string(o.master_port));
}

}  // namespace dtorch::launch
