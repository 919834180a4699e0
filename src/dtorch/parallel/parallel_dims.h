// How the job's ranks divide between data, context, tensor and pipeline parallelism (torchtitan's
// parallel_dims.py): a pure plan of which ranks form each group, and the mesh of split
// communicators built from it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dtorch/comm/communicator.h"

namespace dtorch::parallel {

/// Degrees of parallelism; their product is the world size.
struct ParallelDims {
  /// Data-parallel replicas (or ZeRO shards); 0: whatever the other degrees leave.
  int dp = 0;
  /// Tensor-parallel ranks per model replica; they exchange activations every layer, so
  /// they are consecutive ranks on one node (Note [Mesh layout]).
  int tp = 1;
  /// Pipeline stages.
  int pp = 1;
  /// Context-parallel ranks per model replica, each holding 1/cp of every sequence.
  int cp = 1;
  /// Of the dp ranks, how many groups hold the same shards (HSDP; Note [Hybrid sharding] in
  /// parallel/zero/sharded_model_reduce.cpp): a sharded strategy shards over dp / dp_replicate
  /// consecutive dp ranks and averages each shard across the dp_replicate groups. 1: one group.
  int dp_replicate = 1;
};

/// Note [Mesh layout]: rank = ((pp_index * dp + dp_index) * cp + cp_index) * tp + tp_index,
/// Megatron's order: tensor parallelism varies fastest, so a tp group is tp consecutive ranks,
/// which launchers place on one node; context parallelism next (cp groups stride tp: its ring
/// sends less than tp's per-layer collectives), then data parallelism, pipeline slowest. The
/// ranks that hold the same parameters are a dp x cp group (Megatron's data-parallel group
/// "with context parallelism"): the strategy reduces gradients over it, while the data is
/// split over dp only (the cp ranks of a replica read the same batch and each keep their
/// tokens).
///
/// Under hybrid sharding the dp x cp group divides further: its dp_replicate replicas are
/// runs of dp / dp_replicate consecutive dp indices (so a replica is consecutive ranks, one
/// node's when its size is the ranks per node), and a dp_shard group is one replica's dp x cp
/// ranks; a dp_replicate group holds the ranks at the same place in every replica.
struct MeshPlan {
  int dp = 1, tp = 1, pp = 1, cp = 1, dp_replicate = 1;
  /// Every group of each kind, in job ranks; each rank is in exactly one of each.
  std::vector<std::vector<int>> tp_groups, cp_groups, dp_groups, dp_cp_groups, pp_groups;
  /// Hybrid sharding (dp_replicate > 1): the ranks sharing shards, and those holding the same.
  std::vector<std::vector<int>> dp_shard_groups, dp_replicate_groups;
  /// True when tp exceeds the ranks per node, so activations cross the network every layer.
  bool tp_spans_nodes = false;

  int tp_index(int rank) const { return rank % tp; }
  int cp_index(int rank) const { return rank / tp % cp; }
  int dp_index(int rank) const { return rank / (tp * cp) % dp; }
  int pp_index(int rank) const { return rank / (tp * cp * dp); }
  /// The groups `rank` belongs to.
  const std::vector<int>& tp_group(int rank) const { return tp_groups[rank / tp]; }
  const std::vector<int>& cp_group(int rank) const;
  const std::vector<int>& dp_group(int rank) const;
  /// The dp x cp ranks holding `rank`'s parameters, ordered by (dp_index, cp_index).
  const std::vector<int>& dp_cp_group(int rank) const {
    return dp_cp_groups[pp_index(rank) * tp + tp_index(rank)];
  }
  const std::vector<int>& pp_group(int rank) const { return pp_groups[rank % (tp * cp * dp)]; }
  /// dp indices a replica holds (dp itself without hybrid sharding).
  int dp_shard() const { return dp / dp_replicate; }
  /// Hybrid sharding: `rank`'s dp_shard group, ordered as dp_cp_group, and its dp_replicate
  /// group, ordered by replica.
  const std::vector<int>& dp_shard_group(int rank) const {
    return dp_shard_groups[(pp_index(rank) * dp_replicate + dp_index(rank) / dp_shard()) * tp +
                           tp_index(rank)];
  }
  const std::vector<int>& dp_replicate_group(int rank) const {
    return dp_replicate_groups[((pp_index(rank) * dp_shard() + dp_index(rank) % dp_shard()) * cp +
                                cp_index(rank)) *
                                   tp +
                               tp_index(rank)];
  }
};

/// Checks `dims` against a job of `world_size` ranks, `ranks_per_node` per node, and lays out
/// the groups. Throws ConfigError naming the degrees and the fix when they do not multiply to
/// the world size, or when a tp group would straddle two nodes.
MeshPlan plan_mesh(const ParallelDims& dims, int world_size, int ranks_per_node);

/// One process's view of the mesh: the job's communicator and the groups it belongs to (a
/// group of one rank where that degree is 1, except cp, which is null then; dp_cp is dp itself
/// when cp is 1; dp_shard is dp_cp and dp_replicate null without hybrid sharding).
struct Mesh {
  MeshPlan plan;
  std::shared_ptr<comm::Communicator> world, dp, tp, pp, cp, dp_cp, dp_shard, dp_replicate;
};

/// Plans the mesh for `world`'s job and splits the groups (every rank calls this).
Mesh make_mesh(const std::shared_ptr<comm::Communicator>& world, const ParallelDims& dims);

/// "dp 2 x cp 2 x tp 2" (degrees that are 1 left out; "dp 1" for a single process; "dp 4 (2
/// replicas of 2)" under hybrid sharding).
std::string describe(const MeshPlan& plan);

}  // namespace dtorch::parallel
