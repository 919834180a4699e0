// A user's module wrapped as a models::Model (Note [Your own model]): units by policy, the names
// the user declared, the block hooks around each unit run through call(), activation
// checkpointing on it, and ZeRO-3's warning for a model that names no units.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "dtorch/checkpoint/state_dict.h"
#include "dtorch/comm/communicator.h"
#include "dtorch/core/storage.h"
#include "dtorch/launch/rank_info.h"
#include "dtorch/models/registry.h"
#include "dtorch/models/wrapped_module.h"
#include "dtorch/parallel/activation_checkpoint.h"
#include "dtorch/parallel/zero/zero.h"
#include "models/interop.h"
#include "models/python_peer.h"
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

// A unit that forward runs without models::call() is never gathered: the forward stops, naming
// the unit, rather than compute with parameters that hold no values.
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
  const std::string e = testing::error_of([&] { model->forward(torch::randn({2, 8})); });
  EXPECT_NE(e.find("unit blocks.0 ran without models::call()"), std::string::npos) << e;
}

// Note [Pipeline units of your own model].
const std::vector<std::string> kToyChain = {"in", "blocks.*", "out"};

std::shared_ptr<WrappedModule> toy_stage(UnitRange range) {
  UnitPolicy p;
  p.modules = {"blocks.*"};
  auto model = wrap_module(toy_net(5), p, {}, kToyChain);
  if (range.begin != 0 || range.end != -1) model->hold_units(range);
  return model;
}

// Two stages built from the seed of the whole model run its units: chained, they give its
// output and, by name, its gradients; each holds its own parameters and blocks, no others.
TEST(WrappedModule, PipelineStagesAreTheWholeModelCutBetweenItsUnits) {
  auto whole = toy_stage({});
  EXPECT_EQ(whole->unit_names(),
            (std::vector<std::string>{"in", "blocks.0", "blocks.1", "blocks.2", "out"}));
  auto first = toy_stage({0, 2}), second = toy_stage({2, -1});
  EXPECT_EQ(first->block_names(), (std::vector<std::string>{"blocks.0"}));
  EXPECT_EQ(second->block_names(), (std::vector<std::string>{"blocks.1", "blocks.2"}));
  std::vector<std::string> names = sorted_names(*first), rest = sorted_names(*second);
  for (const auto& n : names)
    EXPECT_TRUE(n.rfind("in.", 0) == 0 || n.rfind("blocks.0.", 0) == 0) << n;
  names.insert(names.end(), rest.begin(), rest.end());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, sorted_names(*whole));
  // What a stage does not hold gives its memory back.
  auto first_net = std::dynamic_pointer_cast<ToyNet>(first->module());
  EXPECT_FALSE(holds_storage(first_net->out->weight));
  EXPECT_FALSE(holds_storage(first_net->blocks->ptr<ToyBlockImpl>(2)->up->weight));

  const torch::Tensor x = torch::randn({5, 8});
  const torch::Tensor want = whole->forward(x);
  want.pow(2).sum().backward();
  const torch::Tensor h = first->forward(x);
  const torch::Tensor received = h.detach().requires_grad_();
  const torch::Tensor got = second->forward(received);
  EXPECT_TRUE(torch::allclose(got, want, 1e-6, 1e-7));
  got.pow(2).sum().backward();
  h.backward(received.grad());
  auto grads = whole->named_parameters();
  for (auto* stage : {first.get(), second.get()})
    for (const auto& kv : stage->named_parameters())
      EXPECT_TRUE(torch::allclose(kv.value().grad(), grads[kv.key()].grad(), 1e-5, 1e-7))
          << kv.key();
}

TEST(WrappedModule, PipelineUnitsHoldEveryParameterAndRunThroughCall) {
  const std::string uncovered = testing::error_of<ConfigError>([] {
    wrap_module(toy_net(1), {}, {}, {"blocks.*", "out"});
  });
  EXPECT_NE(uncovered.find("parameter in.weight is in no pipeline unit"), std::string::npos)
      << uncovered;
  auto tied = toy_net(1);
  tied->blocks->ptr<ToyBlockImpl>(2)->norm->weight.set_data(
      tied->blocks->ptr<ToyBlockImpl>(0)->norm->weight.data());
  const std::string shared =
      testing::error_of<ConfigError>([&] { wrap_module(tied, {}, {}, kToyChain); });
  EXPECT_NE(shared.find("parameters blocks.0.norm.weight and blocks.2.norm.weight share their "
                        "memory (tied weights)"),
            std::string::npos)
      << shared;
  const std::string no_units = testing::error_of<ConfigError>([] {
    wrap_module(toy_net(1))->hold_units({1, 2});
  });
  EXPECT_NE(no_units.find("give wrap_module its pipeline units"), std::string::npos) << no_units;

  struct Direct : ToyNet {
    Direct() : ToyNet(8, 16, 2, 4) {}
    torch::Tensor forward(torch::Tensor x) {
      x = in(x);  // not through models::call()
      for (size_t i = 0; i < blocks->size(); ++i) {
        auto block = blocks->ptr<ToyBlockImpl>(i);
        x = models::call(block, x);
      }
      return models::call(out, x);
    }
  };
  torch::manual_seed(1);
  auto stage = wrap_module(std::make_shared<Direct>(), {}, {}, kToyChain);
  stage->hold_units({1, -1});
  const std::string direct = testing::error_of<ConfigError>([&] {
    stage->forward(torch::randn({2, 8}));
  });
  EXPECT_NE(direct.find("pipeline unit in did not run through models::call()"), std::string::npos)
      << direct;
}

// A registered model builds as dtorch's own do: whole, or a stage by unit range.
TEST(WrappedModule, RegisteredModelsBuildByNameAndByStage) {
  register_model("toy-net", [] {
    UnitPolicy p;
    p.modules = {"blocks.*"};
    return wrap_module(std::make_shared<ToyNet>(8, 16, 3, 4), p, {}, kToyChain);
  });
  const auto names = model_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "toy-net"), names.end());
  std::vector<std::string> units;
  int64_t parameters = 0;
  for (const UnitSize& u : model_units("toy-net")) {
    units.push_back(u.name);
    parameters += u.parameters;
  }
  EXPECT_EQ(units, (std::vector<std::string>{"in", "blocks.0", "blocks.1", "blocks.2", "out"}));
  EXPECT_EQ(parameters, 3524);
  EXPECT_EQ(model_parameters("toy-net"), 3524);
  torch::manual_seed(7);
  auto whole = make_model("toy-net");
  torch::manual_seed(7);
  auto middle = make_model("toy-net", {1, 3});
  auto all = whole->named_parameters();
  EXPECT_EQ(middle->block_names(), (std::vector<std::string>{"blocks.0", "blocks.1"}));
  for (const auto& kv : middle->named_parameters())
    EXPECT_TRUE(kv.value().equal(all[kv.key()])) << kv.key();
  EXPECT_EQ(middle->named_parameters().size(), 12u);  // two blocks of 6

  const std::string taken = testing::error_of<ConfigError>(
      [] { register_model("gpt-debug", [] { return make_model("mnist-mlp"); }); });
  EXPECT_NE(taken.find("a model named 'gpt-debug' exists already"), std::string::npos) << taken;
  register_model("plain-toy", [] { return make_model("mnist-mlp"); });
  EXPECT_EQ(make_model("plain-toy", {0, 1})->num_units(), 1);  // one unit: whole
  const std::string stage = testing::error_of<ConfigError>([] { make_model("toy-net", {3, 9}); });
  EXPECT_NE(stage.find("not a range of this model's 5 pipeline units"), std::string::npos) << stage;
}

// The names the user declared are the state dict's: PyTorch's module of the same architecture
// loads the wrapped model's, and the two stages' joined, strictly, and computes its output.
TEST(WrappedModulePython, StateDictsLoadIntoTheSameModuleInPython) {
  DTORCH_SKIP_WITHOUT_PYTHON(/*need_peer=*/false);
  testing::TempDir tmp("wrapped-module-python");
  auto whole = toy_stage({});
  testing::perturb_constant_tensors(*whole);
  const torch::Tensor x = torch::randn({5, 8});
  const torch::Tensor y = whole->forward(x).detach();
  checkpoint::save_state_dict(*whole, tmp.path() + "/whole.pt");
  // Stages from the same seed, unperturbed: their joined weights are those of toy_stage({}).
  auto first = toy_stage({0, 2}), second = toy_stage({2, -1});
  checkpoint::save_state_dict(*first, tmp.path() + "/first.pt");
  checkpoint::save_state_dict(*second, tmp.path() + "/second.pt");
  const torch::Tensor y_stages = toy_stage({})->forward(x).detach();
  testing::save_tensors(tmp.path() + "/io.pt", {{"x", x}, {"y", y}, {"y_stages", y_stages}});
  const nlohmann::json r = testing::python_json(tmp.path(), R"PY(
import json
import torch
import torch.nn.functional as F
from torch import nn

class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))

class ToyNet(nn.Module):  # ToyNet(8, 16, 3, 4) of tests/support/toy_net.h
    def __init__(self):
        super().__init__()
        setattr(self, "in", nn.Linear(8, 16))  # "in" is a keyword in Python
        self.blocks = nn.ModuleList([Block(16) for _ in range(3)])
        self.out = nn.Linear(16, 4)

    def forward(self, x):
        x = getattr(self, "in")(x)
        for b in self.blocks:
            x = b(x)
        return self.out(x)

io = torch.load("io.pt")
net = ToyNet()
net.load_state_dict(torch.load("whole.pt"), strict=True)
joined = ToyNet()
joined.load_state_dict({**torch.load("first.pt"), **torch.load("second.pt")}, strict=True)
with torch.no_grad():
    print(json.dumps({"whole": (net(io["x"]) - io["y"]).abs().max().item(),
                      "stages": (joined(io["x"]) - io["y_stages"]).abs().max().item()}))
)PY");
  ASSERT_FALSE(r.is_null());
  EXPECT_LE(r["whole"].get<double>(), 1e-5) << r.dump();
  EXPECT_LE(r["stages"].get<double>(), 1e-5) << r.dump();
}

}  // namespace
}  // namespace dtorch::models
