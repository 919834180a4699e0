// Tensor parallelism on a user's own module (Note [Your own model]), with real processes: a toy
// transformer wrapped with a plan (its blocks' up projection by columns, down by rows, as
// Megatron-LM splits an MLP) trains over a tp group of 2 as one process trains it whole, each
// rank holding half of every split weight, with ZeRO-free SGD on both sides.
#include <gtest/gtest.h>

#include "dtorch/core/error.h"
#include "dtorch/models/wrapped_module.h"
#include "dtorch/parallel/tp/tensor_parallel.h"
#include "support/parity.h"
#include "support/toy_net.h"
#include "support/workers.h"

namespace dtorch::tp {
namespace {

// args: DIR SEQUENCE_PARALLEL(0|1). The whole job is one tp group.
DTORCH_TEST_WORKER(tp_own_model) {
  auto world = comm::Communicator::from_env();
  const int n = world->size();
  torch::manual_seed(5);
  auto ref = std::make_shared<testing::ToyNet>(8, 16, 3, 4);
  torch::manual_seed(5);
  auto net = std::make_shared<testing::ToyNet>(8, 16, 3, 4);
  models::UnitPolicy units;
  units.modules = {"blocks.*"};
  auto model = models::wrap_module(
      net, units, {{"blocks.*.up", Style::Colwise}, {"blocks.*.down", Style::Rowwise}});
  auto tp = parallelize(*model, world, plan_for(*model, n), {args.at(1) == "1"});
  for (size_t i = 0; i < net->blocks->size(); ++i) {
    auto b = net->blocks->ptr<testing::ToyBlockImpl>(i);
    DTORCH_CHECK(b->up->weight.size(0) == 32 / n && b->down->weight.size(1) == 32 / n, "block ", i,
                 " holds up ", b->up->weight.sizes(), " and down ", b->down->weight.sizes());
  }
  torch::optim::SGD opt_ref(ref->parameters(), torch::optim::SGDOptions(0.05));
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05));
  double worst_loss = 0;
  for (int step = 0; step < 4; ++step) {
    torch::manual_seed(40 + step);  // the same batch on every tp rank
    const torch::Tensor x = torch::randn({3, 6, 8}), y = torch::randn({3, 6, 4});
    worst_loss =
        std::max(worst_loss, testing::step_side_by_side(
                                 opt_ref, [&] { return torch::mse_loss(ref->forward(x), y); }, opt,
                                 [&] { return torch::mse_loss(model->forward(x), y); }));
  }
  auto full = tp->full_state_dict(*model);
  double worst = 0;
  std::string where;
  for (const auto& kv : ref->named_parameters()) {
    const double d = (full[kv.key()] - kv.value()).abs().max().item<double>();
    if (d > worst) worst = d, where = kv.key();
  }
  DTORCH_CHECK(worst <= 1e-5, "tensor-parallel parameters differ from one process by ", worst,
               " at ", where);
  DTORCH_CHECK(worst_loss <= 1e-5, "loss differs by ", worst_loss);
}

class TensorParallelOwnModel : public ::testing::TestWithParam<const char*> {};

TEST_P(TensorParallelOwnModel, APlanByModuleNameTrainsAsOneProcess) {
  auto dir = testing::scratch_dir("tp_own_model");
  EXPECT_EQ(testing::run_ranks(2, "tp_own_model", {dir, GetParam()}, 120), 0);
}

INSTANTIATE_TEST_SUITE_P(SequenceParallel, TensorParallelOwnModel, ::testing::Values("0", "1"),
                         [](const auto& info) {
                           return std::string(info.param) == "1" ? "sp" : "plain";
                         });

// A wrapped module without a plan: tensor parallelism says how to give one.
TEST(TensorParallelOwnModelPlan, AWrappedModuleWithoutAPlanIsAConfigError) {
  auto model = models::wrap_module(std::make_shared<testing::ToyNet>(8, 16, 1, 4));
  try {
    plan_for(*model, 2);
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("give wrap_module one"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dtorch::tp
