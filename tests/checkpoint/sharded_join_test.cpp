// Tests for reading several sharded checkpoints as one, by parameter name (Note [Resharding by
// name]): two "stages" saved with their own units are read back through a unit cut elsewhere,
// parameters and optimizer state alike, against the values that were saved.
#include "dtorch/checkpoint/sharded_join.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dtorch/comm/communicator.h"
#include "dtorch/core/error.h"
#include "support/workers.h"

namespace dtorch::checkpoint {
namespace {

// Every parameter's saved value at `step`: its own range of numbers, the same in every stage
// that holds it (the tied "a" is in both). Its Adam moment is ten times that.
torch::Tensor truth(const std::string& name, int64_t numel, int64_t step) {
  return torch::arange(numel, torch::kDouble) + double(name[0] * 100 + step * 10000);
}

struct Param {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel;
};
const Param kA{"a", {4}, 4}, kB{"b", {2, 3}, 6}, kC{"c", {3}, 3}, kD{"d", {}, 1};

// Saves one unit per list of parameters, at world size 1, with rng_state = `rng`.
void save_stage(const std::string& dir, int64_t step,
                const std::map<std::string, std::vector<Param>>& units, int64_t rng) {
  ShardedCheckpointData d;
  d.epoch = step;
  d.global_step = step;
  std::vector<ShardPiece> pieces;
  for (const auto& [unit, params] : units) {
    std::vector<torch::Tensor> flat;
    int64_t offset = 0;
    for (const auto& p : params) {
      d.layouts[unit].push_back({p.name, p.shape, offset});
      flat.push_back(truth(p.name, p.numel, step).to(torch::kFloat));
      offset += p.numel;
    }
    torch::Tensor t = torch::cat(flat);
    pieces.push_back({"param/" + unit, offset, 0, t});
    pieces.push_back({"optim/" + unit + "/exp_avg", offset, 0, t * 10});
  }
  auto comm = comm::Communicator::create(launch::RankInfo{});
  save_sharded_checkpoint(
      dir, d, pieces,
      {{"rng_state", torch::tensor({rng})}, {"buffer/bn.mean", torch::full({2}, double(rng))}},
      *comm);
}

template <typename Fn>
void expect_error(Fn fn, const std::string& part) {
  try {
    fn();
    ADD_FAILURE() << "no CheckpointError";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(ShardedJoin, ReadsParametersAndStateThroughUnitsCutElsewhere) {
  const std::string base = testing::scratch_dir("sharded-join");
  const std::string s0 = base + "/pp0", s1 = base + "/pp1";
  for (int64_t step : {1, 2})
    save_stage(s0, step, {{"first", {kA, kB}}}, 7);
  // The second stage's save of step 2 never happened: both are read at step 1.
  save_stage(s1, 1, {{"x", {kC}}, {"y", {kD, kA}}}, 8);

  auto join = ShardedJoin::open({s0, s1});
  ASSERT_TRUE(join.has_value());
  EXPECT_EQ(join->data().global_step, 1);
  EXPECT_EQ(*join->shape("b"), (std::vector<int64_t>{2, 3}));
  EXPECT_FALSE(join->shape("zz").has_value());

  // This run's unit holds c, b, d, a (14 elements); read elements [2, 12), which cut c, b and a.
  const std::vector<FlatLayoutEntry> mine = {
      {"c", {3}, 0}, {"b", {2, 3}, 3}, {"d", {}, 9}, {"a", {4}, 10}};
  torch::Tensor whole =
      torch::cat({truth("c", 3, 1), truth("b", 6, 1), truth("d", 1, 1), truth("a", 4, 1)});
  torch::Tensor got = join->read_range(mine, "param", 2, 12, torch::kDouble);
  EXPECT_EQ(got.scalar_type(), torch::kDouble);
  EXPECT_TRUE(torch::equal(got, whole.narrow(0, 2, 10))) << got << whole;
  got = join->read_range(mine, "optim/exp_avg", 0, 14, torch::kFloat);
  EXPECT_TRUE(torch::equal(got, (whole * 10).to(torch::kFloat)));
  EXPECT_EQ(join->read_range(mine, "param", 5, 5, torch::kFloat).numel(), 0);

  // Full tensors: from the stage holding the named parameter, else the first that has one.
  EXPECT_EQ(join->read_full("rng_state", "c").item<int64_t>(), 8);
  EXPECT_EQ(join->read_full("rng_state", "b").item<int64_t>(), 7);
  EXPECT_EQ(join->read_full("rng_state").item<int64_t>(), 7);
  EXPECT_TRUE(join->has_full("buffer/bn.mean"));
  EXPECT_FALSE(join->has_full("buffer/other"));
  expect_error([&] { join->read_full("buffer/other"); }, "hold no buffer/other");

  // A parameter no stage holds, and a state no stage saved, are named.
  expect_error(
      [&] {
        join->read_range({{"zz", {2}, 0}}, "param", 0, 2, torch::kFloat);
      },
      "hold no parameter zz");
  expect_error([&] { join->read_range(mine, "optim/exp_avg_sq", 0, 1, torch::kFloat); },
               "has no optim/x/exp_avg_sq");
}

TEST(ShardedJoin, FoldersThatDoNotFitTogetherAreNamed) {
  const std::string base = testing::scratch_dir("sharded-join-bad");
  const std::string s0 = base + "/pp0", s1 = base + "/pp1", empty = base + "/none";
  EXPECT_FALSE(ShardedJoin::open({empty, base + "/missing"}).has_value());
  save_stage(s0, 1, {{"first", {kA}}}, 1);
  save_stage(s0, 2, {{"first", {kA}}}, 1);
  expect_error([&] { ShardedJoin::open({s0, empty}); }, empty + " holds no sharded checkpoint");
  // No step both hold: s0 keeps 1 and 2, s1 has only 5.
  save_stage(s1, 5, {{"x", {kC}}}, 2);
  expect_error([&] { ShardedJoin::open({s0, s1}); }, "has no step 2");
}

}  // namespace
}  // namespace dtorch::checkpoint
