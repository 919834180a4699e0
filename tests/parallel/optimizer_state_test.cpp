// Tests for reading and rebuilding SGD, Adam and AdamW state without naming the optimizer
// (parallel/optimizer_state.h), against the state the optimizers create themselves.
#include "dtorch/parallel/optimizer_state.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sstream>

#include "dtorch/core/error.h"
#include "dtorch/core/torch_compat.h"

namespace dtorch::parallel {
namespace {

// One step of `opt` on p with gradient 1..n; returns p's state.
torch::optim::OptimizerParamState& stepped(torch::optim::Optimizer& opt, torch::Tensor& p) {
  p.mutable_grad() = torch::arange(1, p.numel() + 1, torch::kFloat);
  opt.step();
  return *opt.state().at(compat::optimizer_state_key(p));
}

std::vector<std::string> names_of(const torch::optim::OptimizerParamState& s) {
  std::vector<std::string> out;
  for (auto& [name, t] : state_tensors(s))
    out.push_back(name);
  return out;
}

TEST(OptimizerState, NamesTheTensorsOfEachOptimizer) {
  using V = std::vector<std::string>;
  torch::Tensor a = torch::zeros({3}, torch::requires_grad());
  torch::optim::AdamW adamw({a}, torch::optim::AdamWOptions(0.1));
  EXPECT_EQ(names_of(stepped(adamw, a)), (V{"exp_avg", "exp_avg_sq"}));
  torch::Tensor b = torch::zeros({3}, torch::requires_grad());
  torch::optim::Adam adam({b}, torch::optim::AdamOptions(0.1).amsgrad(true));
  EXPECT_EQ(names_of(stepped(adam, b)), (V{"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}));
  torch::Tensor c = torch::zeros({3}, torch::requires_grad());
  torch::optim::SGD sgd({c}, torch::optim::SGDOptions(0.1).momentum(0.9));
  auto& s = stepped(sgd, c);
  EXPECT_EQ(names_of(s), (V{"momentum_buffer"}));
  // SGD's first step stores the gradient itself as the momentum buffer.
  EXPECT_TRUE(torch::equal(state_tensors(s)[0].second, torch::tensor({1.f, 2.f, 3.f})));
  EXPECT_EQ(state_bytes(sgd), 3 * 4);
  EXPECT_EQ(state_bytes(adam), 3 * 3 * 4);
}

TEST(OptimizerState, MapStateMapsTensorsAndKeepsTheStepCount) {
  torch::Tensor p = torch::zeros({4}, torch::requires_grad());
  torch::optim::Adam adam({p}, torch::optim::AdamOptions(0.1));
  stepped(adam, p);
  auto& s = stepped(adam, p);
  EXPECT_EQ(steps_of(s), 2);
  auto half = map_state(s, [](const at::Tensor& t) { return t.narrow(0, 0, 2).clone(); });
  EXPECT_EQ(steps_of(*half), 2);
  auto before = state_tensors(s), after = state_tensors(*half);
  ASSERT_EQ(after.size(), 2u);
  for (size_t k = 0; k < after.size(); ++k)
    EXPECT_TRUE(torch::equal(after[k].second, before[k].second.narrow(0, 0, 2)));
  set_steps(*half, 7);
  EXPECT_EQ(steps_of(*half), 7);
  EXPECT_EQ(steps_of(s), 2) << "a copy, not the original";
}

// A snapshot is the optimizer as it was: its state stays when the original steps on, and its
// serialized form is the original's at the snapshot (what a checkpoint in the background writes).
TEST(OptimizerState, SnapshotKeepsTheStateAsItWasAndSerializesAsTheOriginal) {
  auto serialized = [](torch::optim::Optimizer& opt) {
    torch::serialize::OutputArchive archive;
    opt.save(archive);
    std::ostringstream os;
    archive.save_to(os);
    return os.str();
  };
  torch::Tensor a = torch::zeros({3}, torch::requires_grad());
  torch::Tensor b = torch::zeros({3}, torch::requires_grad());
  torch::Tensor c = torch::zeros({3}, torch::requires_grad());
  torch::optim::AdamW adamw({a}, torch::optim::AdamWOptions(0.1).weight_decay(0.05));
  torch::optim::Adam adam({b}, torch::optim::AdamOptions(0.1).amsgrad(true));
  torch::optim::SGD sgd({c}, torch::optim::SGDOptions(0.1).momentum(0.9));
  std::vector<std::pair<torch::optim::Optimizer*, torch::Tensor*>> all = {
      {&adamw, &a}, {&adam, &b}, {&sgd, &c}};
  for (auto [opt, p] : all) {
    stepped(*opt, *p);
    const std::string before = serialized(*opt);
    auto snap = snapshot_optimizer(*opt, [](const at::Tensor& t) { return t.clone(); });
    stepped(*opt, *p);
    EXPECT_NE(serialized(*opt), before);
    EXPECT_EQ(serialized(*snap), before);
    EXPECT_EQ(snap->param_groups().size(), opt->param_groups().size());
  }
}

// A fresh state loaded into the optimizer steps exactly as the optimizer's own first step.
TEST(OptimizerState, FreshStateIsWhatTheOptimizerStartsFrom) {
  for (bool amsgrad : {false, true}) {
    torch::Tensor p = torch::ones({5}, torch::requires_grad());
    torch::Tensor q = torch::ones({5}, torch::requires_grad());
    torch::optim::AdamW own({p}, torch::optim::AdamWOptions(0.1).amsgrad(amsgrad));
    torch::optim::AdamW seeded({q}, torch::optim::AdamWOptions(0.1).amsgrad(amsgrad));
    seeded.state()[compat::optimizer_state_key(q)] = fresh_state(seeded, q);
    EXPECT_EQ(state_tensors(*seeded.state().begin()->second).size(), amsgrad ? 3u : 2u);
    stepped(own, p);
    stepped(seeded, q);
    EXPECT_TRUE(torch::equal(p, q)) << "amsgrad " << amsgrad;
  }
  torch::Tensor r = torch::ones({2}, torch::requires_grad());
  torch::optim::SGD plain({r}, torch::optim::SGDOptions(0.1));
  EXPECT_EQ(fresh_state(plain, r), nullptr) << "SGD without momentum keeps no state";
  torch::optim::SGD momentum({r}, torch::optim::SGDOptions(0.1).momentum(0.9));
  auto st = fresh_state(momentum, r);
  ASSERT_NE(st, nullptr);
  EXPECT_TRUE(torch::equal(state_tensors(*st)[0].second, torch::zeros({2})));
}

TEST(OptimizerState, OtherOptimizersAreAConfigErrorNamingTheSupportedOnes) {
  torch::Tensor p = torch::zeros({2}, torch::requires_grad());
  torch::optim::RMSprop rms({p}, torch::optim::RMSpropOptions(0.1));
  auto& s = stepped(rms, p);
  try {
    state_tensors(s);
    FAIL() << "expected an error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("SGD, Adam and AdamW"), std::string::npos) << e.what();
  }
  EXPECT_THROW(fresh_state(rms, p), ConfigError);
}

}  // namespace
}  // namespace dtorch::parallel
