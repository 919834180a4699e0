// Slurm's environment -> Detected (one srun task per rank) and JobAllocation (the job's hosts).
// A job step's own variables (SLURM_STEP_*) win over the job's, since a step may use part of it.
#include <numeric>

#include "dtorch/core/env.h"
#include "dtorch/core/error.h"
#include "dtorch/launch/detect.h"
#include "dtorch/launch/slurm_lists.h"

namespace dtorch::launch {
namespace {

// The first of `names` that is set, with its name, for messages that say where a value came from.
struct Var {
  const char* name = nullptr;
  std::optional<long> value;
};
Var first_int(std::initializer_list<const char*> names) {
  for (const char* n : names) {
    if (auto v = env::get_int(n)) return {n, v};
  }
  return {*names.begin(), std::nullopt};
}

std::optional<std::string> job_id() {
  if (auto id = env::get("SLURM_JOB_ID")) return id;
  return env::get("SLURM_JOBID");
}

}  // namespace

std::optional<JobAllocation> slurm_allocation() {
  auto id = job_id();
  if (!id) return std::nullopt;
  JobAllocation a;
  a.scheduler = "Slurm";
  a.job_id = *id;
  const char* list_var = nullptr;
  for (const char* n : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
    if (env::get(n)) {
      list_var = n;
      break;
    }
  }
  if (list_var) a.hosts = expand_slurm_hostlist(*env::get(list_var));
  a.nnodes = static_cast<int>(a.hosts.size());
  if (a.hosts.empty()) {
    a.nnodes =
        static_cast<int>(first_int({"SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES"})
                             .value.value_or(0));
  }
  return a;
}

std::optional<Detected> detect_slurm() {
  auto id = job_id();
  auto procid = env::get_int("SLURM_PROCID");
  if (!id && !procid) return std::nullopt;
  // The batch script (and an salloc shell) carries the job's SLURM_NTASKS and SLURM_PROCID=0 but
  // is one process; only srun's tasks, which have a step id, are ranks.
  if (!env::get("SLURM_STEP_ID") && !env::get("SLURM_STEPID")) return std::nullopt;
  Var world = first_int({"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"});
  Var nodes = first_int({"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"});
  auto localid = env::get_int("SLURM_LOCALID");
  auto nodeid = env::get_int("SLURM_NODEID");
  DTORCH_CHECK_T(
      ConfigError, procid && world.value && localid && nodeid && nodes.value,
      "this is a Slurm job step, but SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, ",
      "SLURM_NODEID and SLURM_NNODES are not all set (SLURM_PROCID=", procid.value_or(-1),
      ", SLURM_NTASKS=", world.value.value_or(-1), ", SLURM_LOCALID=", localid.value_or(-1),
      ", SLURM_NODEID=", nodeid.value_or(-1), ", SLURM_NNODES=", nodes.value.value_or(-1),
      "); start the ranks with srun, or set RANK, WORLD_SIZE, MASTER_ADDR and ",
      "MASTER_PORT yourself");
  Detected d;
  d.source = "Slurm";
  d.rank_var = "SLURM_PROCID";
  d.world_var = world.name;
  RankInfo& r = d.info;
  r.master_addr.clear();
  r.master_port = 0;
  r.rank = static_cast<int>(*procid);
  r.world_size = static_cast<int>(*world.value);
  r.local_rank = static_cast<int>(*localid);
  r.node_rank = static_cast<int>(*nodeid);
  r.nnodes = static_cast<int>(*nodes.value);
  DTORCH_CHECK_T(ConfigError, r.world_size >= 1 && r.rank >= 0 && r.rank < r.world_size,
                 "SLURM_PROCID=", r.rank, " is not within ", world.name, "=", r.world_size);
  DTORCH_CHECK_T(ConfigError, r.nnodes >= 1 && r.node_rank >= 0 && r.node_rank < r.nnodes,
                 "SLURM_NODEID=", r.node_rank, " is not within ", nodes.name, "=", r.nnodes);

  // Tasks on this node: the per-node list ("2(x3),1") if there is one, else the uniform count.
  const char* list_var = nullptr;
  for (const char* n : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
    if (env::get(n)) {
      list_var = n;
      break;
    }
  }
  if (list_var) {
    std::vector<int> per_node = expand_slurm_tasks_per_node(*env::get(list_var));
    int total = std::accumulate(per_node.begin(), per_node.end(), 0);
    DTORCH_CHECK_T(
        ConfigError, static_cast<int>(per_node.size()) == r.nnodes && total == r.world_size,
        list_var, "=", *env::get(list_var), " lists ", per_node.size(), " nodes and ", total,
        " tasks, but ", nodes.name, "=", r.nnodes, " and ", world.name, "=", r.world_size,
        "; the job's variables disagree (was one of them exported by ", "hand?)");
    r.local_world_size = per_node[r.node_rank];
  } else if (auto per = env::get_int("SLURM_NTASKS_PER_NODE")) {
    r.local_world_size = static_cast<int>(*per);
  } else {
    DTORCH_CHECK_T(ConfigError, r.nnodes == 1, "Slurm gives no tasks per node ",
                   "(SLURM_TASKS_PER_NODE or SLURM_NTASKS_PER_NODE) for a ", r.nnodes,
                   "-node step; run the ranks with srun, which sets it");
    r.local_world_size = r.world_size;
  }
  DTORCH_CHECK_T(ConfigError,
                 r.local_world_size >= 1 && r.local_rank >= 0 &&
                     r.local_rank < r.local_world_size && r.local_world_size <= r.world_size,
                 "SLURM_LOCALID=", r.local_rank, " does not fit the ", r.local_world_size,
                 " tasks Slurm places on node ", r.node_rank, " (of ", world.name, "=",
                 r.world_size, ")");
  return d;
}

}  // namespace dtorch::launch
