// How a run spreads its model besides the data-parallel strategy: tensor, sequence, context
// and pipeline parallelism and recomputation. A plain struct that a run's configuration holds
// and parallelize() (train/parallelize.h) applies.
#pragma once

#include <cstdint>
#include <string>

#include "dtorch/parallel/cp/kind.h"
#include "dtorch/parallel/pp/schedule.h"

namespace dtorch::train {
inline namespace config {

/// How a model is spread besides its data-parallel strategy: steps 1, 2, 3 and 5 of Note
/// [Assembly order]. The data-parallel degree is what is left: world / (tp x cp x pp).
struct ParallelismConfig {
  /// Tensor-parallel ranks per model replica (gpt-*, vit-*; parallel/parallel_dims.h).
  int tp = 1;
  /// Megatron's sequence parallelism inside each tp group (needs tp > 1).
  bool sequence_parallel = false;
  /// Context-parallel ranks per model replica (gpt-*, vit-*): each holds 1/cp of every sequence
  /// (parallel/cp/context_parallel.h).
  int cp = 1;
  /// How attention spans a context-parallel group: ring attention or Ulysses.
  cp::Kind cp_kind = cp::Kind::Ring;
  /// Pipeline ranks (gpt-*, resnet*, vit-*): each builds and runs its own stages (1: none).
  int pp = 1;
  /// Micro-batches per batch under a pipeline: >= 1 when parallelize() runs (run_config.h's
  /// resolve() derives it; Note [Micro-batches]).
  int microbatches = 0;
  pp::ScheduleKind schedule = pp::ScheduleKind::OneFOneB;  ///< under a pipeline
  std::string pp_split;  ///< unit names where stages 1.. begin; empty: balanced
  /// Recompute every K-th block's forward in backward instead of keeping its activations
  /// (parallel/activation_checkpoint.h; 1: every block, 0: off).
  int activation_checkpointing = 0;
  /// Hybrid sharding under zero1-3 (Note [Hybrid sharding] in
  /// parallel/zero/sharded_model_reduce.cpp): the data-parallel ranks form this many replicas
  /// of consecutive ranks, each sharding the model over its own ranks. 0: one replica a node.
  int64_t dp_replicate = 1;
};

/// The data-parallel ranks of a job of `world_size` ranks under `c`: world / (tp x cp x pp),
/// at least 1.
int data_parallel_size(const ParallelismConfig& c, int world_size);

/// Throws ConfigError naming the flag and the fix for a setting that cannot hold whatever the
/// job and the model (those parallelize() checks).
void validate(const ParallelismConfig& c);

/// `c` with --dp-replicate auto (0) made the number of nodes a pipeline stage's ranks span (the
/// nodes, without --pp: a replica a node); checks that it divides the data-parallel ranks of a
/// job of `world_size` ranks, `ranks_per_node` a node.
ParallelismConfig resolve_replicas(ParallelismConfig c, int world_size, int ranks_per_node);

}  // namespace config
}  // namespace dtorch::train
