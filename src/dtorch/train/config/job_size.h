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

}  // namespace config
}  // namespace dtorch::train
