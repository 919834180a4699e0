// Note [Deferred initialisation], ZeRO-3's half, with real processes: a model built without
// memory and sharded over N ranks holds, put together, exactly the weights a one-process
// make_model gives from the same seed (in float32, and rounded alike in bfloat16), leaves the
// generator as that does, and trains: its first loss equals the one-process model's. DDP and
// ZeRO-1/2 refuse such a model. The models' half is tests/models/deferred_model_test.cpp.
#include <gtest/gtest.h>

#include <fstream>

#include "dtorch/core/error.h"
#include "dtorch/core/storage.h"
#include "dtorch/models/registry.h"
#include "dtorch/parallel/autocast.h"
#include "dtorch/parallel/zero/zero.h"
#include "dtorch/train/loss.h"
#include "support/batches.h"
#include "support/parity.h"
#include "support/workers.h"

namespace dtorch::zero {
namespace {

// args: DIR MODEL DTYPE (fp32 | bf16)
DTORCH_TEST_WORKER(zero_deferred_init) {
  const std::string model_name = args.at(1);
  const torch::Dtype dtype = args.at(2) == "bf16" ? torch::kBFloat16 : torch::kFloat;
  auto comm = comm::Communicator::from_env();

  for (int stage : {1, 2}) {
    torch::manual_seed(7);
    Options o;
    o.stage = stage;
    bool refused = false;
    try {
      shard(models::make_deferred_model(model_name), comm, o, testing::plain_sgd(0.1));
    } catch (const ConfigError& e) {
      refused = std::string(e.what()).find("only ZeRO-3") != std::string::npos;
    }
    DTORCH_CHECK(refused, "ZeRO-", stage, " did not refuse a model built without memory");
  }

  torch::manual_seed(7);
  auto model = models::make_deferred_model(model_name);
  for (const auto& p : model->parameters())
    DTORCH_CHECK(!holds_storage(p), "a deferred model's parameter holds memory");
  Options o;
  o.stage = 3;
  o.param_dtype = dtype;
  o.min_unit_params = 0;
  auto sharded = shard(model, comm, o, testing::plain_sgd(0.1));
  const at::Tensor next = torch::randn({8});

  torch::manual_seed(7);
  auto ref = models::make_model(model_name);
  DTORCH_CHECK(torch::equal(next, torch::randn({8})),
               "sharding a deferred model changed what the generator gives next");

  std::string differs;
  {
    auto full = sharded->full_params();
    auto got = model->named_parameters();
    for (const auto& kv : ref->named_parameters()) {
      at::Tensor want = kv.value().to(dtype);
      if (!torch::equal(got[kv.key()], want)) differs += kv.key() + " ";
    }
  }
  auto [x, y] = testing::random_batch(*ref, 99);
  const double ref_loss = train::cross_entropy(ref->forward(x), y).item<double>();
  torch::Tensor loss;
  {
    parallel::Autocast autocast({dtype == torch::kBFloat16});  // as the trainer runs bf16
    loss = train::cross_entropy(model->forward(x), y);
  }
  loss.backward();
  sharded->step();
  std::ofstream(str(args.at(0), "/rank", comm->rank()))
      << (differs.empty() ? "same" : differs) << "\n"
      << ref_loss << " " << loss.item<double>() << "\n";
}

struct InitCase {
  int ranks;
  const char* model;
  const char* dtype;
};

class ZeroDeferredInit : public ::testing::TestWithParam<InitCase> {};

TEST_P(ZeroDeferredInit, ShardsPutTogetherEqualTheOneProcessInit) {
  const InitCase c = GetParam();
  auto dir = testing::scratch_dir("zero_deferred_init");
  ASSERT_EQ(testing::run_ranks(c.ranks, "zero_deferred_init", {dir, c.model, c.dtype}, 180), 0);
  for (int r = 0; r < c.ranks; ++r) {
    std::ifstream in(str(dir, "/rank", r));
    std::string same;
    double ref_loss = -1, loss = -2;
    std::getline(in, same);
    in >> ref_loss >> loss;
    EXPECT_EQ(same, "same") << "rank " << r << ": these parameters differ";
    // fp32: the same weights and the same kernels; bf16 computes in bfloat16.
    const double tol = std::string(c.dtype) == "bf16" ? 0.05 : 1e-5;
    EXPECT_NEAR(loss, ref_loss, tol * std::max(1.0, std::abs(ref_loss))) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, ZeroDeferredInit,
    ::testing::Values(InitCase{4, "gpt-debug", "fp32"}, InitCase{4, "vit-debug", "fp32"},
                      InitCase{3, "resnet-debug", "fp32"}, InitCase{3, "gpt-debug", "bf16"}),
    [](const auto& info) {
      std::string m = info.param.model;
      for (auto& ch : m)
        if (ch == '-') ch = '_';
      return m + "_" + info.param.dtype + "_" + std::to_string(info.param.ranks) + "ranks";
    });

}  // namespace
}  // namespace dtorch::zero
