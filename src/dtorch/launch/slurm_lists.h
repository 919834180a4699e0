// Slurm's compact list notations, expanded: host lists (`gpu[01-03,07],cpu5`) and task counts
// per node (`2(x3),1`). Pure functions, so the syntax is tested without a cluster.
#pragma once

#include <string>
#include <vector>

namespace dtorch::launch {

/// Expands a Slurm host list (SLURM_JOB_NODELIST) into host names, in order:
/// `gpu[01-03,07],cpu5` -> gpu01 gpu02 gpu03 gpu07 cpu5. Ranges keep their zero padding
/// (`n[008-010]`), several bracket groups in one name multiply out (`a[1-2]b[3-4]` -> a1b3
/// a1b4 a2b3 a2b4, as `scontrol show hostnames` does), and text after a group is kept
/// (`n[1-2]-ib`). Throws ConfigError naming the list when it is malformed.
std::vector<std::string> expand_slurm_hostlist(const std::string& list);

/// Expands SLURM_TASKS_PER_NODE / SLURM_STEP_TASKS_PER_NODE (`2(x3),1` -> 2 2 2 1), one entry
/// per node. Throws ConfigError naming the value when it is malformed.
std::vector<int> expand_slurm_tasks_per_node(const std::string& counts);

}  // namespace dtorch::launch
