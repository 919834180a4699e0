// Shard planning: units tile the parameters, shards tile each padded unit, and the wrap
// policy follows the model's blocks; replicas' parts of a checkpoint slice tile it.
#include "dtorch/parallel/zero/shard_plan.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dtorch/core/error.h"
#include "dtorch/parallel/zero/zero.h"

namespace dtorch::zero {
namespace {

std::vector<ParamInfo> gpt_like() {
  return {{"wte.weight", 100}, {"h.0.w", 30},  {"h.0.b", 3},      {"h.1.w", 30},
          {"h.1.b", 3},        {"h.10.w", 30}, {"ln_f.weight", 5}};
}

TEST(ShardPlan, PadsEachUnitToAMultipleOfTheWorldAndTilesShards) {
  auto params = gpt_like();
  auto plan = make_plan(params, units_by_size(params, 40), 4);
  // {100}, {30,3}, {30,3}, {30,5}: a unit closes before the parameter that would take it over
  // 40, and a parameter above the cap has a unit of its own.
  ASSERT_EQ(plan.units.size(), 4u);
  EXPECT_EQ(plan.units[0].numel, 100);
  EXPECT_EQ(plan.units[1].numel, 33);
  EXPECT_EQ(plan.units[1].padded, 36);
  EXPECT_EQ(plan.units[1].shard, 9);
  EXPECT_EQ(plan.units[3].numel, 35);
  // Rank 3 of unit 1 owns [27, 33): the last 3 elements of its shard are padding.
  EXPECT_EQ(plan.units[1].owned(3), (std::pair<int64_t, int64_t>{27, 33}));
  int64_t total = 0;
  for (auto& u : plan.units) {
    int64_t off = 0;
    for (auto& e : u.entries) {
      EXPECT_EQ(e.offset, off);
      off += e.numel;
    }
    int64_t covered = 0;
    for (int r = 0; r < 4; ++r) {
      auto [b, e] = u.owned(r);
      EXPECT_EQ(b, std::min(u.numel, r * u.shard));
      covered += e - b;
    }
    EXPECT_EQ(covered, u.numel);
    total += u.numel;
  }
  EXPECT_EQ(total, 201);
  for (size_t i = 0; i < params.size(); ++i) {
    auto [u, k] = plan.where[i];
    EXPECT_EQ(plan.units[u].entries[k].param, i);
  }
}

TEST(ShardPlan, ShardOfATinyUnitMayBeAllPadding) {
  std::vector<ParamInfo> params{{"a", 2}};
  auto plan = make_plan(params, units_by_size(params, 10), 4);
  EXPECT_EQ(plan.units[0].shard, 1);
  EXPECT_EQ(plan.units[0].owned(2), (std::pair<int64_t, int64_t>{2, 2}));
  EXPECT_EQ(plan.units[0].owned(3), (std::pair<int64_t, int64_t>{2, 2}));
}

TEST(ShardPlan, BlocksPolicyMakesRootThenOneUnitPerBlock) {
  auto params = gpt_like();
  auto units = units_by_blocks(params, {"h.0", "h.1", "h.10"}, 0);
  ASSERT_EQ(units.size(), 4u);
  EXPECT_EQ(units[0].name, "root");
  EXPECT_EQ(units[0].params, (std::vector<size_t>{0, 6}));
  EXPECT_EQ(units[1].params, (std::vector<size_t>{1, 2}));
  // "h.1." must not swallow "h.10.w".
  EXPECT_EQ(units[2].params, (std::vector<size_t>{3, 4}));
  EXPECT_EQ(units[3].params, (std::vector<size_t>{5}));
  EXPECT_EQ(units[3].blocks, (std::vector<std::string>{"h.10"}));
}

TEST(ShardPlan, ThresholdMergesConsecutiveBlocks) {
  auto units = units_by_blocks(gpt_like(), {"h.0", "h.1", "h.10"}, 60);
  ASSERT_EQ(units.size(), 3u);
  EXPECT_EQ(units[1].blocks, (std::vector<std::string>{"h.0", "h.1"}));
  EXPECT_EQ(units[2].blocks, (std::vector<std::string>{"h.10"}));
}

TEST(ShardPlan, BadBlocksAreConfigErrors) {
  EXPECT_THROW(units_by_blocks(gpt_like(), {"nope"}, 0), ConfigError);
  EXPECT_THROW(units_by_blocks(gpt_like(), {"h", "h.0"}, 0), ConfigError);
  std::vector<UnitSpec> missing{{"u", {0}, {}}};
  EXPECT_THROW(make_plan(gpt_like(), missing, 2), ConfigError);
}

// Note [Hybrid sharding]: the replicas write their parts of each slice, which tile it in order
// and alias it; a slice shorter than the replica count leaves some replicas nothing.
TEST(ReplicaPart, PartsTileEachSliceOnce) {
  const torch::Tensor a = torch::arange(10, torch::kFloat), b = torch::arange(2, torch::kFloat);
  const std::vector<ShardSlice> slices = {{"param/u", 40, 20, a}, {"optim/u/exp_avg", 7, 5, b}};
  for (int count : {1, 2, 3}) {
    std::map<std::string, std::vector<int64_t>> covered;
    for (int index = 0; index < count; ++index) {
      for (const ShardSlice& part : replica_part(slices, index, count)) {
        const ShardSlice& whole = part.key == "param/u" ? slices[0] : slices[1];
        EXPECT_EQ(part.full_numel, whole.full_numel);
        EXPECT_TRUE(part.data.is_alias_of(whole.data));
        EXPECT_TRUE(
            part.data.equal(whole.data.narrow(0, part.begin - whole.begin, part.data.numel())));
        for (int64_t i = 0; i < part.data.numel(); ++i)
          covered[part.key].push_back(part.begin + i);
      }
    }
    EXPECT_EQ(covered["param/u"], (std::vector<int64_t>{20, 21, 22, 23, 24, 25, 26, 27, 28, 29}))
        << count;
    EXPECT_EQ(covered["optim/u/exp_avg"], (std::vector<int64_t>{5, 6})) << count;
  }
  EXPECT_EQ(replica_part(slices, 0, 3).size(), 1u) << "b's 2 elements: replicas 1 and 2";
}

}  // namespace
}  // namespace dtorch::zero
