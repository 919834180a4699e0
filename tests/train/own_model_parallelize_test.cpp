// A user's own module through train::parallelize (Note [Your own model], Note [Pipeline units of
// your own model]), with real processes: registered by name, it is cut into pipeline stages,
// split by its tensor plan, recomputed and sharded as dtorch's models are, and trains as one
// process trains it whole on the whole batch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>

#include "dtorch/core/error.h"
#include "dtorch/models/registry.h"
#include "dtorch/models/wrapped_module.h"
#include "dtorch/train/loss.h"
#include "dtorch/train/parallelize.h"
#include "dtorch/train/step.h"
#include "support/toy_net.h"
#include "support/workers.h"

namespace dtorch::train {
namespace {

// ToyNet with every way in: its blocks as units, a Megatron MLP split, its pipeline units.
void register_toy() {
  models::register_model("toy-net", [] {
    models::UnitPolicy units;
    units.modules = {"blocks.*"};
    return models::wrap_module(std::make_shared<testing::ToyNet>(8, 16, 4, 4), units,
                               {{"blocks.*.up", models::TensorSplit::Colwise},
                                {"blocks.*.down", models::TensorSplit::Rowwise}},
                               {"in", "blocks.*", "out"});
  });
}

// args: DIR LAYOUT (zero3-tp2-sp-ac: ZeRO-3 over dp 2 x sequence-parallel tp 2, every block
// recomputed; pp2-dp2: two stages under 1F1B, DDP over dp 2). Four SGD steps on a global batch
// of 4 x 6 tokens; every rank also trains the model whole alone on all of it; the job's mean
// loss and this rank's parameters (the unsplit values of those it holds) are compared.
DTORCH_TEST_WORKER(own_model_parallelize) {
  register_toy();
  auto world = comm::Communicator::from_env();
  const std::string layout_name = args.at(1);
  ParallelizeSpec spec;
  spec.model = "toy-net";
  spec.strategy.optimizer.kind = OptimizerKind::SGD;
  spec.strategy.optimizer.lr = 0.1;
  spec.strategy.optimizer.momentum = 0;
  if (layout_name == "zero3-tp2-sp-ac") {
    spec.strategy.kind = StrategyKind::Zero3;
    spec.parallelism.tp = 2;
    spec.parallelism.sequence_parallel = true;
    spec.parallelism.activation_checkpointing = 1;
  } else {
    DTORCH_CHECK(layout_name == "pp2-dp2", "unknown layout ", layout_name);
    spec.parallelism.pp = 2;
    spec.parallelism.microbatches = 2;
  }
  torch::manual_seed(0);
  auto ref = models::make_model("toy-net");
  torch::optim::SGD opt(ref->parameters(), torch::optim::SGDOptions(0.1));
  torch::manual_seed(0);
  Parallelized run = parallelize(spec, world);
  const Layout& layout = run.layout;
  const int64_t B = 2, T = 6;
  double worst_loss = 0;
  for (int step = 0; step < 4; ++step) {
    torch::manual_seed(100 + step);
    const int64_t rows = B * layout.data_ranks();
    const torch::Tensor x = torch::randn({rows, T, 8});
    const torch::Tensor y = torch::randint(0, 4, {rows, T}, torch::kLong);
    opt.zero_grad();
    const torch::Tensor l_ref = cross_entropy(ref->forward(x), y);
    l_ref.backward();
    opt.step();
    const torch::Tensor l = train::step(run, x.narrow(0, layout.data_rank() * B, B),
                                        y.narrow(0, layout.data_rank() * B, B));
    torch::Tensor mean = l.detach().to(torch::kDouble).reshape({1});
    layout.dp->allreduce(mean, comm::ReduceOp::Avg, "loss");
    worst_loss = std::max(worst_loss, std::abs(mean.item<double>() - l_ref.item<double>()));
  }
  auto whole = run.strategy->whole_parameters();
  const tp::TensorParallel* split = layout.tp.handle.get();
  torch::OrderedDict<std::string, torch::Tensor> mine =
      split ? split->full_state_dict(*run.model) : run.model->named_parameters();
  auto want = ref->named_parameters();
  double worst = 0;
  std::string where;
  for (const auto& kv : mine) {
    const double d = (kv.value() - want[kv.key()]).abs().max().item<double>();
    if (d > worst) worst = d, where = kv.key();
  }
  std::ofstream(args.at(0) + "/rank" + std::to_string(world->rank()))
      << layout_name << ": " << mine.size() << " parameters, worst " << worst << " at " << where
      << ", loss " << worst_loss << "\n";
  DTORCH_CHECK(mine.size() > 0 && worst <= 1e-5 && worst_loss <= 1e-5, layout_name,
               " differs from one process: parameters by ", worst, " at ", where, ", loss by ",
               worst_loss);
}

class OwnModelParallelize : public ::testing::TestWithParam<const char*> {};

TEST_P(OwnModelParallelize, FourStepsMatchOneProcessOnTheWholeBatch) {
  const std::string dir = testing::scratch_dir("own_model_parallelize");
  EXPECT_EQ(testing::run_ranks(4, "own_model_parallelize", {dir, GetParam()}, 120), 0);
  for (int r = 0; r < 4; ++r) {
    std::ifstream in(dir + "/rank" + std::to_string(r));
    std::cout << "rank " << r << ": " << in.rdbuf();
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, OwnModelParallelize,
                         ::testing::Values("zero3-tp2-sp-ac", "pp2-dp2"), [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace dtorch::train
