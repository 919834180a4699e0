// Activation checkpointing on one process: gradients and BatchNorm statistics are those of the
// run without it for every built-in block model and for a block with dropout (the recomputation
// draws the same random numbers), checkpointed blocks run twice per step and others once, and
// bad settings are named.
#include "dtorch/parallel/activation_checkpoint.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dtorch/core/error.h"
#include "dtorch/models/registry.h"

namespace dtorch::parallel {
namespace {

torch::Tensor input_for(const models::Model& m, int64_t batch) {
  if (m.takes_tokens()) return torch::randint(0, 256, {batch, 16}, torch::kLong);
  return torch::randn({batch, 1, 28, 28});
}

// Gradients (and buffers) after one forward and backward of `m` on a fixed batch.
std::map<std::string, torch::Tensor> one_step(models::Model& m) {
  torch::manual_seed(7);
  torch::Tensor x = input_for(m, 4);
  m.zero_grad();
  torch::Tensor out = m.forward(x);
  (out.pow(2).mean() + out.mean()).backward();
  std::map<std::string, torch::Tensor> got;
  for (const auto& kv : m.named_parameters())
    got["grad " + kv.key()] =
        kv.value().grad().defined() ? kv.value().grad().clone() : torch::Tensor();
  for (const auto& kv : m.named_buffers())
    got["buffer " + kv.key()] = kv.value().clone();
  return got;
}

void expect_identical(const std::map<std::string, torch::Tensor>& got,
                      const std::map<std::string, torch::Tensor>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [key, t] : want) {
    ASSERT_EQ(got.at(key).defined(), t.defined()) << what << " " << key;
    if (!t.defined()) continue;
    EXPECT_TRUE(got.at(key).equal(t))
        << what << " " << key << " differs by "
        << (got.at(key).to(torch::kDouble) - t.to(torch::kDouble)).abs().max().item<double>();
  }
}

TEST(ActivationCheckpointing, GradientsAndStatisticsAreThoseWithoutIt) {
  for (const std::string name : {"gpt-debug", "vit-debug", "resnet-debug"}) {
    for (int every : {1, 2}) {
      torch::manual_seed(1);
      auto plain = models::make_model(name);
      torch::manual_seed(1);
      auto checkpointed = models::make_model(name);
      checkpoint_activations(*checkpointed, {every});
      plain->train();
      checkpointed->train();
      expect_identical(one_step(*checkpointed), one_step(*plain),
                       name + " every " + std::to_string(every));
    }
  }
}

// Two blocks, each Linear -> dropout, counting how often each block's forward runs.
class DropoutBlocks : public models::Model {
 public:
  DropoutBlocks() {
    a_ = register_module("a", torch::nn::Linear(8, 8));
    b_ = register_module("b", torch::nn::Linear(8, 8));
  }
  torch::Tensor forward(torch::Tensor x) override {
    x = run_block("a", x, [this](torch::Tensor t) {
      ++runs["a"];
      return torch::dropout(torch::relu(a_->forward(t)), 0.5, is_training());
    });
    return run_block("b", x, [this](torch::Tensor t) {
      ++runs["b"];
      return torch::dropout(b_->forward(t), 0.5, is_training());
    });
  }
  std::vector<std::string> block_names() const override { return {"a", "b"}; }
  torch::nn::Linear a_{nullptr}, b_{nullptr};
  std::map<std::string, int> runs;
};

TEST(ActivationCheckpointing, RecomputationDrawsTheSameDropoutMasks) {
  auto step = [](DropoutBlocks& m) {
    torch::manual_seed(3);
    torch::Tensor x = torch::randn({16, 8}, torch::requires_grad());
    m.zero_grad();
    m.forward(x).sum().backward();
    return std::make_pair(m.a_->weight.grad().clone(), x.grad().clone());
  };
  torch::manual_seed(2);
  DropoutBlocks plain;
  torch::manual_seed(2);
  DropoutBlocks checkpointed;
  checkpoint_activations(checkpointed, {1});
  auto [wp, xp] = step(plain);
  auto [wc, xc] = step(checkpointed);
  EXPECT_TRUE(wc.equal(wp));
  EXPECT_TRUE(xc.equal(xp));  // the input's gradient too
  EXPECT_EQ(plain.runs, (std::map<std::string, int>{{"a", 1}, {"b", 1}}));
  EXPECT_EQ(checkpointed.runs, (std::map<std::string, int>{{"a", 2}, {"b", 2}}));
  // The random stream after the step is where the run without checkpointing leaves it.
  torch::manual_seed(5);
  step(plain);
  const double after_plain = torch::rand({1}).item<double>();
  torch::manual_seed(5);
  step(checkpointed);
  EXPECT_EQ(torch::rand({1}).item<double>(), after_plain);

  // Every second block: only "a" runs again. Without a graph (evaluation): once each.
  DropoutBlocks every2;
  checkpoint_activations(every2, {2});
  step(every2);
  EXPECT_EQ(every2.runs, (std::map<std::string, int>{{"a", 2}, {"b", 1}}));
  every2.runs.clear();
  {
    torch::NoGradGuard no_grad;
    every2.forward(torch::randn({2, 8}));
  }
  EXPECT_EQ(every2.runs, (std::map<std::string, int>{{"a", 1}, {"b", 1}}));
  // Off again.
  checkpoint_activations(every2, {0});
  every2.runs.clear();
  step(every2);
  EXPECT_EQ(every2.runs, (std::map<std::string, int>{{"a", 1}, {"b", 1}}));
}

TEST(ActivationCheckpointing, BadSettingsAreNamed) {
  DropoutBlocks m;
  EXPECT_THROW(checkpoint_activations(m, {-1}), ConfigError);
  auto mlp = models::make_model("mnist-mlp");
  try {
    checkpoint_activations(*mlp, {1});
    ADD_FAILURE() << "a model without blocks was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("names no blocks"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dtorch::parallel
