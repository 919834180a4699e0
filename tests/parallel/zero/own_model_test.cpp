// ZeRO-3 on a user's own module (Note [Your own model]), with real processes: wrapped with its
// blocks as units it trains as DDP trains the same module unwrapped, with or without activation
// checkpointing; between steps a rank holds its shards alone (the ZeRO-3 formula), and while it
// computes, beyond them, at most the root and two units whole, never the whole model.
#include <gtest/gtest.h>

#include "dtorch/core/error.h"
#include "dtorch/models/wrapped_module.h"
#include "dtorch/parallel/activation_checkpoint.h"
#include "dtorch/parallel/ddp/ddp.h"
#include "dtorch/parallel/zero/zero.h"
#include "support/parity.h"
#include "support/toy_net.h"
#include "support/workers.h"

namespace dtorch::zero {
namespace {

// args: DIR CHECKPOINTING (plain | checkpointed)
DTORCH_TEST_WORKER(zero_own_model) {
  const bool checkpointed = args.at(1) == "checkpointed";
  auto comm = comm::Communicator::from_env();
  const int n = comm->size();

  torch::manual_seed(11);
  auto ref = std::make_shared<testing::ToyNet>(8, 16, 4, 4);
  auto ddp = ddp::wrap(ref, comm);
  auto ref_opt = testing::plain_sgd(0.05)(ref->parameters());
  torch::manual_seed(11);
  auto net = std::make_shared<testing::ToyNet>(8, 16, 4, 4);
  int64_t whole = 0;
  for (const auto& p : net->parameters())
    whole += p.numel() * 4;
  models::UnitPolicy units;
  units.modules = {"blocks.*"};
  auto model = models::wrap_module(net, units);
  if (checkpointed) parallel::checkpoint_activations(*model, {1});
  Options o;
  o.stage = 3;
  auto sharded = shard(model, comm, o, testing::plain_sgd(0.05));

  const ShardPlan& plan = sharded->plan();
  DTORCH_CHECK(plan.units.size() == 5, "the plan has ", plan.units.size(), " units, not 5");
  int64_t formula = 0, biggest = 0;
  for (const Unit& u : plan.units) {
    DTORCH_CHECK(u.shard == (u.numel + n - 1) / n, "unit ", u.name, "'s shard is ", u.shard);
    formula += u.shard * 4;
    if (u.name != "root") biggest = std::max(biggest, u.padded * 4);
  }
  const int64_t root = plan.units[0].padded * 4;

  for (int step = 0; step < 3; ++step) {
    torch::manual_seed(100 + 7 * step + comm->rank());
    const torch::Tensor x = torch::randn({6, 8}), y = torch::randn({6, 4});
    torch::mse_loss(ref->forward(x), y).backward();
    ref_opt->step();
    ref_opt->zero_grad();

    torch::mse_loss(model->forward(x), y).backward();
    sharded->step();
    sharded->zero_grad();
    const MemoryStats m = sharded->memory();
    DTORCH_CHECK(m.param_bytes == formula, "step ", step, ": the rank holds ", m.param_bytes,
                 " parameter bytes between steps, not its shards' ", formula);
    // Beyond its shards, the root and two blocks (one running, the next prefetched): less than
    // the whole model, which a rank of a model without units gathers.
    const int64_t gathered = m.peak_param_bytes - formula;
    DTORCH_CHECK(gathered <= root + 2 * biggest && root + 2 * biggest < whole, "step ", step, ": ",
                 gathered, " parameter bytes gathered at once (root ", root, ", largest unit ",
                 biggest, ", model ", whole, ")");
  }
  torch::NoGradGuard no_grad;
  torch::manual_seed(999 + comm->rank());
  const torch::Tensor x = torch::randn({6, 8});
  const double diff = (model->forward(x) - ref->forward(x)).abs().max().item<double>();
  DTORCH_CHECK(diff <= 1e-5, "after 3 steps ZeRO-3's output differs from DDP's by ", diff);
}

class ZeroOwnModel : public ::testing::TestWithParam<const char*> {};

TEST_P(ZeroOwnModel, UnitsByNameTrainLikeDdpAndHoldTheirShards) {
  auto dir = testing::scratch_dir("zero_own_model");
  EXPECT_EQ(testing::run_ranks(2, "zero_own_model", {dir, GetParam()}, 120), 0);
}

INSTANTIATE_TEST_SUITE_P(Checkpointing, ZeroOwnModel, ::testing::Values("plain", "checkpointed"));

}  // namespace
}  // namespace dtorch::zero
