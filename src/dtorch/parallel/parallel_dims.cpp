// Mesh planning (pure) and the split communicators that carry it out.
#include "dtorch/parallel/parallel_dims.h"

#include "dtorch/core/error.h"
#include "dtorch/core/log.h"

namespace dtorch::parallel {

const std::vector<int>& MeshPlan::cp_group(int rank) const {
  return cp_groups[rank / (tp * cp) * tp + tp_index(rank)];
}

const std::vector<int>& MeshPlan::dp_group(int rank) const {
  return dp_groups[(pp_index(rank) * cp + cp_index(rank)) * tp + tp_index(rank)];
}

MeshPlan plan_mesh(const ParallelDims& dims, int world_size, int ranks_per_node) {
  DTORCH_CHECK_T(ConfigError, dims.tp >= 1 && dims.pp >= 1 && dims.cp >= 1 && dims.dp >= 0,
                 "parallel degrees must be positive: tp ", dims.tp, ", cp ", dims.cp, ", pp ",
                 dims.pp, ", dp ", dims.dp, " (dp 0 means the rest)");
  const int fixed = dims.tp * dims.cp * dims.pp;
  DTORCH_CHECK_T(ConfigError, world_size % fixed == 0, "tp ", dims.tp, " x cp ", dims.cp, " x pp ",
                 dims.pp, " = ", fixed, " does not divide the job's ", world_size,
                 " ranks: choose degrees whose product divides the world size (--tp, --cp, "
                 "--pp), or change --nproc-per-node / --nnodes");
  MeshPlan p;
  p.tp = dims.tp;
  p.pp = dims.pp;
  p.cp = dims.cp;
  p.dp = dims.dp == 0 ? world_size / fixed : dims.dp;
  DTORCH_CHECK_T(ConfigError, p.dp * fixed == world_size, "dp ", p.dp, " x tp ", p.tp, " x cp ",
                 p.cp, " x pp ", p.pp, " = ", p.dp * fixed, " ranks, but the job has ", world_size,
                 ": leave dp out (it takes the rest) or make the product ", world_size);
  p.dp_replicate = dims.dp_replicate;
  DTORCH_CHECK_T(ConfigError, p.dp_replicate >= 1 && p.dp % p.dp_replicate == 0, "--dp-replicate ",
                 p.dp_replicate, " does not divide the ", p.dp,
                 " data-parallel ranks into groups of equal size: give a divisor of ", p.dp,
                 " (the number of nodes, for one shard group a node)");
  if (p.tp <= ranks_per_node) {
    DTORCH_CHECK_T(ConfigError, ranks_per_node % p.tp == 0, "tp ", p.tp, " does not divide the ",
                   ranks_per_node,
                   " ranks per node, so a tensor-parallel group would straddle "
                   "two nodes: choose a tp that divides ",
                   ranks_per_node);
  } else {
    DTORCH_CHECK_T(ConfigError, p.tp % ranks_per_node == 0, "tp ", p.tp, " is not a multiple of ",
                   "the ", ranks_per_node,
                   " ranks per node: tensor-parallel groups must be "
                   "whole nodes when they span nodes");
    p.tp_spans_nodes = true;
  }
  const int n = world_size;
  for (int g = 0; g < n / p.tp; ++g) {
    p.tp_groups.emplace_back();
    for (int t = 0; t < p.tp; ++t)
      p.tp_groups.back().push_back(g * p.tp + t);
  }
  auto rank_of = [&p](int s, int d, int c, int t) {
    return ((s * p.dp + d) * p.cp + c) * p.tp + t;
  };
  for (int s = 0; s < p.pp; ++s) {
    for (int d = 0; d < p.dp; ++d) {
      for (int t = 0; t < p.tp; ++t) {
        p.cp_groups.emplace_back();
        for (int c = 0; c < p.cp; ++c)
          p.cp_groups.back().push_back(rank_of(s, d, c, t));
      }
    }
    for (int c = 0; c < p.cp; ++c) {
      for (int t = 0; t < p.tp; ++t) {
        p.dp_groups.emplace_back();
        for (int d = 0; d < p.dp; ++d)
          p.dp_groups.back().push_back(rank_of(s, d, c, t));
      }
    }
    for (int t = 0; t < p.tp; ++t) {
      p.dp_cp_groups.emplace_back();
      for (int d = 0; d < p.dp; ++d)
        for (int c = 0; c < p.cp; ++c)
          p.dp_cp_groups.back().push_back(rank_of(s, d, c, t));
    }
  }
  if (p.dp_replicate > 1) {
    const int shard = p.dp_shard();
    for (int s = 0; s < p.pp; ++s) {
      for (int r = 0; r < p.dp_replicate; ++r) {
        for (int t = 0; t < p.tp; ++t) {
          p.dp_shard_groups.emplace_back();
          for (int d = r * shard; d < (r + 1) * shard; ++d)
            for (int c = 0; c < p.cp; ++c)
              p.dp_shard_groups.back().push_back(rank_of(s, d, c, t));
        }
      }
      for (int j = 0; j < shard; ++j) {
        for (int c = 0; c < p.cp; ++c) {
          for (int t = 0; t < p.tp; ++t) {
            p.dp_replicate_groups.emplace_back();
            for (int r = 0; r < p.dp_replicate; ++r)
              p.dp_replicate_groups.back().push_back(rank_of(s, r * shard + j, c, t));
          }
        }
      }
    }
  }
  for (int i = 0; i < p.dp * p.cp * p.tp; ++i) {
    p.pp_groups.emplace_back();
    for (int s = 0; s < p.pp; ++s)
      p.pp_groups.back().push_back(s * p.dp * p.cp * p.tp + i);
  }
  return p;
}

Mesh make_mesh(const std::shared_ptr<comm::Communicator>& world, const ParallelDims& dims) {
  Mesh m;
  m.plan = plan_mesh(dims, world->size(), world->info().local_world_size);
  if (m.plan.tp_spans_nodes && world->rank() == 0) {
    log::warn("tp ", m.plan.tp, " spans nodes: tensor-parallel activations cross the network ",
              "in every layer; a tp that divides the ranks per node is usually faster");
  }
  const int r = world->rank();
  m.world = world;
  // Splits in one order on every rank (Note [Process groups]).
  m.tp = world->split(m.plan.tp_group(r), "tp");
  m.dp = world->split(m.plan.dp_group(r), "dp");
  m.pp = world->split(m.plan.pp_group(r), "pp");
  if (m.plan.cp > 1) {
    m.cp = world->split(m.plan.cp_group(r), "cp");
    m.dp_cp = world->split(m.plan.dp_cp_group(r), "dp_cp");
  } else {
    m.dp_cp = m.dp;
  }
  m.dp_shard = m.dp_cp;
  if (m.plan.dp_replicate > 1) {
    m.dp_shard = world->split(m.plan.dp_shard_group(r), "dp_shard");
    m.dp_replicate = world->split(m.plan.dp_replicate_group(r), "dp_replicate");
  }
  return m;
}

std::string describe(const MeshPlan& p) {
  std::string s;
  auto add = [&](const char* name, int d) {
    if (d > 1) s += (s.empty() ? "" : " x ") + std::string(name) + " " + std::to_string(d);
  };
  add("pp", p.pp);
  add("dp", p.dp);
  add("cp", p.cp);
  add("tp", p.tp);
  if (s.empty()) s = "dp 1";
  if (p.dp_replicate > 1) {
    const std::string dp = "dp " + std::to_string(p.dp);
    s.insert(s.find(dp) + dp.size(), " (" + std::to_string(p.dp_replicate) + " replicas of " +
                                         std::to_string(p.dp_shard()) + ")");
  }
  return s;
}

}  // namespace dtorch::parallel
