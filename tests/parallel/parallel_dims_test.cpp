// Mesh planning without processes: groups laid out as Note [Mesh layout] says, and degrees that
// do not fit the job rejected with the fix named.
#include "dtorch/parallel/parallel_dims.h"

#include <gtest/gtest.h>

#include "dtorch/core/error.h"
#include "support/error_of.h"

namespace dtorch::parallel {
namespace {

using Groups = std::vector<std::vector<int>>;

TEST(ParallelDims, DataTimesTensorOnEightRanks) {
  MeshPlan p = plan_mesh({/*dp=*/0, /*tp=*/2}, 8, 4);
  EXPECT_EQ(p.dp, 4);
  EXPECT_EQ(p.tp_groups, (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(p.dp_groups, (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(p.pp_groups.size(), 8u);
  EXPECT_FALSE(p.tp_spans_nodes);
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(p.tp_group(r)[p.tp_index(r)], r);
    EXPECT_EQ(p.dp_group(r)[p.dp_index(r)], r);
  }
  EXPECT_EQ(describe(p), "dp 4 x tp 2");
}

TEST(ParallelDims, ContextParallelRanksStrideTensorParallelOnesAndShareGradients) {
  MeshPlan p = plan_mesh({/*dp=*/0, /*tp=*/2, /*pp=*/1, /*cp=*/2}, 8, 8);
  EXPECT_EQ(p.dp, 2);
  EXPECT_EQ(p.tp_groups, (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(p.cp_groups, (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(p.dp_groups, (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  // Every rank holding the same parameters (the same tensor-parallel shard) reduces together.
  EXPECT_EQ(p.dp_cp_groups, (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(p.cp_group(r)[p.cp_index(r)], r);
    EXPECT_EQ(p.dp_group(r)[p.dp_index(r)], r);
    EXPECT_EQ(p.dp_cp_group(r)[p.dp_index(r) * p.cp + p.cp_index(r)], r);
  }
  EXPECT_EQ(describe(p), "dp 2 x cp 2 x tp 2");
  MeshPlan q = plan_mesh({0, 1, 2, 2}, 8, 8);
  EXPECT_EQ(q.cp_groups, (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(q.pp_groups, (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(q.dp_cp_groups, (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  const std::string e = testing::error_of([] { plan_mesh({0, 1, 1, 3}, 8, 8); });
  EXPECT_NE(e.find("cp 3"), std::string::npos) << e;
}

TEST(ParallelDims, ThreeDimensionsEveryRankOnceInEachKind) {
  MeshPlan p = plan_mesh({2, 2, 2}, 8, 8);
  EXPECT_EQ(p.tp_groups, (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(p.dp_groups, (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(p.pp_groups, (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(p.pp_group(r)[p.pp_index(r)], r);
    EXPECT_EQ(p.dp_group(r)[p.dp_index(r)], r);
  }
  EXPECT_EQ(describe(p), "pp 2 x dp 2 x tp 2");
  EXPECT_EQ(describe(plan_mesh({}, 1, 1)), "dp 1");
}

TEST(ParallelDims, TensorParallelAcrossWholeNodesIsAllowedAndFlagged) {
  MeshPlan p = plan_mesh({0, 4}, 8, 2);
  EXPECT_TRUE(p.tp_spans_nodes);
  EXPECT_EQ(p.tp_groups, (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
}

// Note [Hybrid sharding]: a replica is one node's consecutive ranks; the shard groups tile the
// dp x cp group of each tp index, and the replicate groups join the same place in each replica.
TEST(ParallelDims, HybridShardingSplitsTheDataParallelGroupIntoReplicas) {
  MeshPlan p = plan_mesh({0, 1, 1, 1, /*dp_replicate=*/2}, 4, 2);
  EXPECT_EQ(p.dp_shard(), 2);
  EXPECT_EQ(p.dp_shard_groups, (Groups{{0, 1}, {2, 3}}));
  EXPECT_EQ(p.dp_replicate_groups, (Groups{{0, 2}, {1, 3}}));
  EXPECT_EQ(describe(p), "dp 4 (2 replicas of 2)");
  // tp 2 inside a node of 4 and cp 2 across it: 16 ranks, 2 nodes of 8.
  MeshPlan q = plan_mesh({0, 2, 1, 2, 2}, 16, 8);
  EXPECT_EQ(q.dp, 4);
  EXPECT_EQ(q.dp_shard_groups,
            (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
  EXPECT_EQ(q.dp_replicate_groups.size(), 8u);
  EXPECT_EQ(q.dp_replicate_group(5), (std::vector<int>{5, 13}));
  EXPECT_EQ(describe(q), "dp 4 (2 replicas of 2) x cp 2 x tp 2");
  for (int r = 0; r < 16; ++r) {
    const auto& shard = q.dp_shard_group(r);
    const auto& whole = q.dp_cp_group(r);
    // Each shard group is the dp x cp group's run of ranks of one replica, in its order.
    const int replica = q.dp_index(r) / q.dp_shard();
    EXPECT_EQ(shard, std::vector<int>(whole.begin() + replica * shard.size(),
                                      whole.begin() + (replica + 1) * shard.size()))
        << r;
    EXPECT_EQ(q.dp_replicate_group(r)[replica], r);
  }
  const std::string e = testing::error_of([] { plan_mesh({0, 1, 1, 1, 3}, 4, 2); });
  EXPECT_NE(e.find("--dp-replicate 3 does not divide the 4 data-parallel ranks"), std::string::npos)
      << e;
}

std::string error_of(const ParallelDims& d, int world, int per_node) {
  return testing::error_of([&] { plan_mesh(d, world, per_node); });
}

TEST(ParallelDims, DegreesThatDoNotFitAreNamed) {
  EXPECT_NE(error_of({0, 3}, 8, 8).find("tp 3 x cp 1 x pp 1 = 3 does not divide the job's 8 ranks"),
            std::string::npos);
  EXPECT_NE(error_of({3, 2}, 8, 8).find("dp 3 x tp 2 x cp 1 x pp 1 = 6 ranks, but the job has 8"),
            std::string::npos);
  EXPECT_NE(error_of({0, 2}, 6, 3).find("tp 2 does not divide the 3 ranks per node"),
            std::string::npos);
  EXPECT_NE(error_of({0, 0}, 4, 4).find("must be positive"), std::string::npos);
}

}  // namespace
}  // namespace dtorch::parallel
