// How many replicas --dp-replicate auto makes (Note [Hybrid sharding] in
// parallel/zero/sharded_model_reduce.cpp). Apart from parallel_dims.h so that a run's plain
// settings (train/config/) and the planner resolve it without the communicator.
#pragma once

#include <algorithm>

namespace dtorch::parallel {

/// --dp-replicate auto: a replica a node, over the nodes one pipeline stage's ranks span (the
/// stages vary slowest, Note [Mesh layout]: a stage within one node needs no replicas). 1 where
/// a stage does not fill whole nodes.
inline int replicas_a_node(int world_size, int pp, int ranks_per_node) {
  const int stage = world_size / std::max(1, pp);
  return ranks_per_node > 0 && stage > ranks_per_node && stage % ranks_per_node == 0
             ? stage / ranks_per_node
             : 1;
}

}  // namespace dtorch::parallel
