// The size of a training job: nodes, ranks per node, ranks. A run's config.json records it
// (Note [The job's size in config.json] in run_config.h).
#pragma once

namespace dtorch::train {
inline namespace config {

/// The size of the job a run trained in; 0s when not known (a config.json written before the
/// section, or by hand; a job whose nodes hold unequal ranks).
struct JobSize {
  int nnodes = 0;
  int nproc_per_node = 0;
  int world_size = 0;
  bool known() const { return world_size > 0; }
};

/// The size of a job of `world_size` ranks with `local_world_size` on this node; not known
/// when the ranks cannot fill equal nodes (its nodes hold unequal ranks).
inline JobSize job_size_of(int world_size, int local_world_size) {
  if (local_world_size <= 0 || world_size <= 0 || world_size % local_world_size != 0) return {};
  return {world_size / local_world_size, local_world_size, world_size};
}

}  // namespace config
}  // namespace dtorch::train
