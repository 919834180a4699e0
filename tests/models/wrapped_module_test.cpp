// A user's module wrapped as a models::Model (Note [Your own model]): units by policy, the names
// the user declared, the block hooks around each unit run through call(), activation
// checkpointing on it, and ZeRO-3's warning for a model that names no units.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "dtorch/comm/communicator.h"
#include "dtorch/launch/rank_info.h"
#include "dtorch/models/wrapped_module.h"
#include "dtorch/parallel/activation_checkpoint.h"
#include "dtorch/parallel/zero/zero.h"
#include "support/error_of.h"
#include "support/parity.h"
#include "support/toy_net.h"

namespace dtorch::models {
namespace {

using testing::ToyBlockImpl;
using testing::ToyNet;

std::shared_ptr<ToyNet> toy_net(uint64_t seed) {
  torch::manual_seed(seed);
  return std::make_shared<ToyNet>(8, 16, 3, 4);  // blocks of 1104 parameters each
}

std::vector<std::string> sorted_names(torch::nn::Module& m) {
  std::vector<std::string> names;
  for (const auto& kv : m.named_parameters())
    names.push_back(kv.key());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(WrappedModule, PolicyPicksModulesByPathOrPattern) {
  auto net = toy_net(1);
  UnitPolicy p;
  p.modules = {"blocks.*"};
  EXPECT_EQ(resolve_units(*net, p), (std::vector<std::string>{"blocks.0", "blocks.1", "blocks.2"}));
  p.modules = {"blocks.2.up", "blocks.0"};  // listed in named_modules() order whatever the order
  EXPECT_EQ(resolve_units(*net, p), (std::vector<std::string>{"blocks.0", "blocks.2.up"}));
  p.modules = {"blocks.*.down"};
  EXPECT_EQ(resolve_units(*net, p),
            (std::vector<std::string>{"blocks.0.down", "blocks.1.down", "blocks.2.down"}));
}

TEST(WrappedModule, PolicyBySizeGoesFromTheLeavesUp) {
  auto net = toy_net(1);
  UnitPolicy p;
  p.min_params = 600;  // no Linear reaches it (544, 528), a block does (1104)
  EXPECT_EQ(resolve_units(*net, p), (std::vector<std::string>{"blocks.0", "blocks.1", "blocks.2"}));
  p.min_params = 500;  // both Linears do; what is left of a block (its norm, 32) does not
  EXPECT_EQ(resolve_units(*net, p),
            (std::vector<std::string>{"blocks.0.up", "blocks.0.down", "blocks.1.up",
                                      "blocks.1.down", "blocks.2.up", "blocks.2.down"}));
  p.min_params = 1'000'000;
  EXPECT_TRUE(resolve_units(*net, p).empty());
  EXPECT_TRUE(resolve_units(*net, UnitPolicy{}).empty());
}

TEST(WrappedModule, BadPoliciesAreConfigErrorsNamingTheEntry) {
  auto net = toy_net(1);
  UnitPolicy p;
  p.modules = {"layers.*"};
  const std::string none = testing::error_of<ConfigError>([&] { resolve_units(*net, p); });
  EXPECT_NE(none.find("unit 'layers.*' names no submodule"), std::string::npos) << none;
  EXPECT_NE(none.find("blocks.0"), std::string::npos) << none;
  p.modules = {"blocks", "blocks.1"};
  const std::string nested = testing::error_of<ConfigError>([&] { resolve_units(*net, p); });
  EXPECT_NE(nested.find("unit blocks holds unit blocks.1"), std::string::npos) << nested;
  p = {};
  p.min_params = -1;
  EXPECT_NE(testing::error_of<ConfigError>([&] { resolve_units(*net, p); }).find("min_params"),
            std::string::npos);
}

TEST(WrappedModule, KeepsTheNamesAndTensorsTheUserDeclared) {
  auto net = toy_net(1);
  UnitPolicy p;
  p.modules = {"blocks.*"};
  auto model = wrap_module(net, p);
  EXPECT_EQ(sorted_names(*model), sorted_names(*net));
  auto mine = model->named_parameters();
  for (const auto& kv : net->named_parameters())
    EXPECT_TRUE(mine[kv.key()].is_same(kv.value())) << kv.key();
  EXPECT_EQ(model->block_names(), resolve_units(*net, p));
  EXPECT_TRUE(model->scopes_forward());
}

TEST(WrappedModule, RunsEachUnitBetweenTheBlockHooks) {
  auto net = toy_net(1);
  UnitPolicy p;
  p.modules = {"blocks.*"};
  auto model = wrap_module(net, p);
  std::vector<std::string> seen;
  Model::BlockHooks hooks;
  hooks.forward_begin = [&] { seen.push_back("begin"); };
  hooks.before = [&](const std::string& b) { seen.push_back("before " + b); };
  hooks.after = [&](const std::string& b, torch::Tensor out) {
    seen.push_back("after " + b);
    return out * 2;  // what `after` returns is what the model continues with
  };
  hooks.forward_end = [&](torch::Tensor out) {
    seen.push_back("end");
    return out;
  };
  const torch::Tensor x = torch::randn({5, 8});
  model->set_block_hooks(hooks);
  const torch::Tensor got = model->forward(x);
  EXPECT_EQ(seen, (std::vector<std::string>{"begin", "before blocks.0", "after blocks.0",
                                            "before blocks.1", "after blocks.1", "before blocks.2",
                                            "after blocks.2", "end"}));
  // The same forward by hand: each block's output doubled.
  torch::Tensor want = net->in(x);
  for (size_t i = 0; i < net->blocks->size(); ++i)
    want = net->blocks->ptr<ToyBlockImpl>(i)->forward(want) * 2;
  EXPECT_TRUE(torch::allclose(got, net->out(want)));
}

TEST(WrappedModule, ActivationCheckpointingRecomputesEachUnitWithTheSameGradients) {
  auto plain = toy_net(3);
  auto net = toy_net(3);
  UnitPolicy p;
  p.modules = {"blocks.*"};
  auto model = wrap_module(net, p);
  parallel::checkpoint_activations(*model, {1});
  const torch::Tensor x = torch::randn({6, 8});
  plain->forward(x).pow(2).sum().backward();
  model->forward(x).pow(2).sum().backward();
  auto want = plain->named_parameters();
  for (const auto& kv : net->named_parameters())
    EXPECT_TRUE(torch::allclose(kv.value().grad(), want[kv.key()].grad(), 1e-5, 1e-6)) << kv.key();
  for (size_t i = 0; i < net->blocks->size(); ++i) {
    EXPECT_EQ(net->blocks->ptr<ToyBlockImpl>(i)->runs.load(), 2) << "block " << i;
    EXPECT_EQ(plain->blocks->ptr<ToyBlockImpl>(i)->runs.load(), 1) << "block " << i;
  }
}

TEST(WrappedModule, DroppingTheWrapperTakesItsHooksOff) {
  auto net = toy_net(1);
  UnitPolicy p;
  p.modules = {"blocks.*"};
  wrap_module(net, p).reset();
  for (size_t i = 0; i < net->blocks->size(); ++i)
    EXPECT_EQ(module_hooks(*net->blocks->ptr<ToyBlockImpl>(i)), nullptr);
  EXPECT_EQ(net->forward(torch::randn({2, 8})).size(1), 4);
}

// Stage 3 on a model without units holds the whole model on every rank: it says so, once.
TEST(WrappedModule, ZeroThreeWarnsWhenTheModelNamesNoUnits) {
  auto comm = comm::Communicator::create(launch::RankInfo{});
  zero::Options o;
  o.stage = 3;
  auto sgd = testing::plain_sgd(0.1);
  ::testing::internal::CaptureStderr();
  auto plain = zero::shard(toy_net(1), comm, o, sgd);
  const std::string warned = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(warned.find("ZeRO-3: the model names no units, so every rank holds all 3524 of its "
                        "parameters"),
            std::string::npos)
      << warned;
  EXPECT_NE(warned.find("models::wrap_module"), std::string::npos) << warned;

  UnitPolicy p;
  p.modules = {"blocks.*"};
  ::testing::internal::CaptureStderr();
  auto sharded = zero::shard(wrap_module(toy_net(1), p), comm, o, sgd);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  std::vector<std::string> units;
  for (const auto& u : sharded->plan().units)
    units.push_back(u.name);
  EXPECT_EQ(units, (std::vector<std::string>{"root", "blocks.0", "blocks.1", "blocks.2"}));
}

// A unit that forward runs without models::call() is never gathered: ZeRO-3 stops the forward
// rather than compute with parameters that hold no values.
TEST(WrappedModule, AUnitRunWithoutCallStopsTheForward) {
  struct Bypass : ToyNet {
    Bypass() : ToyNet(8, 16, 2, 4) {}
    torch::Tensor forward(torch::Tensor x) {
      x = in(x);
      for (size_t i = 0; i < blocks->size(); ++i)
        x = blocks->ptr<ToyBlockImpl>(i)->forward(x);
      return out(x);
    }
  };
  auto comm = comm::Communicator::create(launch::RankInfo{});
  zero::Options o;
  o.stage = 3;
  UnitPolicy p;
  p.modules = {"blocks.*"};
  auto model = wrap_module(std::make_shared<Bypass>(), p);
  auto sharded = zero::shard(model, comm, o, testing::plain_sgd(0.1));
  EXPECT_ANY_THROW(model->forward(torch::randn({2, 8})));
}

}  // namespace
}  // namespace dtorch::models
