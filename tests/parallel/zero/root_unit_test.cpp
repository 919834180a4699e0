// ZeRO-3's root unit (Note [Sharding stages]), with real processes: for a model that scopes its
// forward, nothing is gathered between steps; the root is gathered as forward begins, held
// through backward and released once its gradients are reduced (or released after forward and
// gathered again for backward with reshard_root_after_forward); the allgather bytes of a step
// are exactly those gathers; evaluation leaves nothing gathered; and training matches DDP.
#include <gtest/gtest.h>

#include "dtorch/core/error.h"
#include "dtorch/models/registry.h"
#include "dtorch/parallel/ddp/ddp.h"
#include "dtorch/parallel/zero/zero.h"
#include "dtorch/train/loss.h"
#include "support/batches.h"
#include "support/parity.h"
#include "support/workers.h"

namespace dtorch::zero {
namespace {

// args: DIR MODEL MODE (keep | reshard)
DTORCH_TEST_WORKER(zero_root_unit) {
  const std::string model_name = args.at(1);
  const bool reshard = args.at(2) == "reshard";
  auto comm = comm::Communicator::from_env();
  const int n = comm->size();

  torch::manual_seed(7);
  auto ref = models::make_model(model_name);
  auto ddp = ddp::wrap(ref, comm);
  auto ref_opt = testing::plain_sgd(0.1)(ref->parameters());
  torch::manual_seed(7);
  auto model = models::make_model(model_name);
  Options o;
  o.stage = 3;
  o.reshard_root_after_forward = reshard;
  auto sharded = shard(model, comm, o, testing::plain_sgd(0.1));

  // What the rank holds beyond its fp32 masters: its gathered units.
  const ShardPlan& plan = sharded->plan();
  int64_t masters = 0, all_units = 0;
  for (const Unit& u : plan.units) {
    masters += u.shard * 4;
    all_units += u.padded * 4;
  }
  DTORCH_CHECK(plan.units.at(0).name == "root", "unit 0 is ", plan.units[0].name, ", not the root");
  const int64_t root = plan.units[0].padded * 4;
  auto gathered = [&] { return sharded->memory().param_bytes - masters; };
  DTORCH_CHECK(gathered() == 0, "after set-up ", gathered(), " bytes are gathered, not 0");
  DTORCH_CHECK(sharded->memory().resident_unit_bytes == 0, "a unit stays gathered between steps");

  for (int step = 0; step < 3; ++step) {
    auto [x, y] = testing::random_batch(*ref, 500 + 31 * step + comm->rank());
    train::cross_entropy(ref->forward(x), y).backward();
    ref_opt->step();
    ref_opt->zero_grad();

    comm->reset_traffic();
    torch::Tensor logits = model->forward(x);
    const int64_t after_forward = reshard ? 0 : root;
    DTORCH_CHECK(gathered() == after_forward, "step ", step, ": after forward ", gathered(),
                 " bytes are gathered, not ", after_forward);
    train::cross_entropy(logits, y).backward();
    DTORCH_CHECK(gathered() == 0, "step ", step, ": after backward ", gathered(),
                 " bytes are gathered, not 0");
    sharded->step();
    sharded->zero_grad();
    DTORCH_CHECK(gathered() == 0, "step ", step, ": after the optimizer step ", gathered(),
                 " bytes are gathered, not 0");
    // Every unit twice (forward, backward) but a root kept from forward through backward.
    const int64_t units_gathered = 2 * all_units - (reshard ? 0 : root);
    const int64_t want = (n - 1) * units_gathered / n;
    const int64_t got = comm->traffic().allgather;
    DTORCH_CHECK(std::abs(got - want) <= static_cast<int64_t>(plan.units.size()) * 2 * n, "step ",
                 step, ": ", got, " allgather bytes, expected ", want);
  }

  torch::NoGradGuard no_grad;
  auto [x, y] = testing::random_batch(*ref, 599 + comm->rank());
  comm->reset_traffic();
  const at::Tensor got = model->forward(x);
  DTORCH_CHECK(gathered() == 0, "after an evaluation forward ", gathered(), " bytes are gathered");
  DTORCH_CHECK(comm->traffic().allgather <= (n - 1) * all_units / n + n * 8,
               "an evaluation forward gathered ", comm->traffic().allgather, " bytes");
  const double diff = (got - ref->forward(x)).abs().max().item<double>();
  DTORCH_CHECK(diff <= 1e-5, "after 3 steps ZeRO-3's output differs from DDP's by ", diff);
}

struct RootCase {
  const char* model;
  const char* mode;
};

class ZeroRootUnit : public ::testing::TestWithParam<RootCase> {};

TEST_P(ZeroRootUnit, GatheredPerStepAndTrainsLikeDdp) {
  const RootCase c = GetParam();
  auto dir = testing::scratch_dir("zero_root_unit");
  EXPECT_EQ(testing::run_ranks(2, "zero_root_unit", {dir, c.model, c.mode}, 180), 0);
}

INSTANTIATE_TEST_SUITE_P(Models, ZeroRootUnit,
                         ::testing::Values(RootCase{"gpt-debug", "keep"},
                                           RootCase{"gpt-debug", "reshard"},
                                           RootCase{"mnist-cnn", "keep"}),
                         [](const auto& info) {
                           std::string m = info.param.model;
                           for (auto& ch : m)
                             if (ch == '-') ch = '_';
                           return m + "_" + info.param.mode;
                         });

}  // namespace
}  // namespace dtorch::zero
