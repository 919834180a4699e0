// Tests for the Model interface's block hooks: call order, that `after`'s return value is what
// the model continues with, and that every registered model runs its blocks only inside them.
#include "dtorch/models/model.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <set>

#include "dtorch/models/registry.h"

namespace dtorch::models {
namespace {

// y = b(2 a(x)): blocks "a" and "b" with a non-block step between them.
class TwoBlocks : public Model {
 public:
  TwoBlocks() {
    a_ = register_module("a", torch::nn::Linear(3, 3));
    b_ = register_module("b", torch::nn::Linear(3, 2));
  }
  torch::Tensor forward(torch::Tensor x) override {
    x = run_block("a", x, [&](torch::Tensor t) { return a_->forward(t); });
    x = x * 2;
    return run_block("b", x, [&](torch::Tensor t) { return b_->forward(t); });
  }
  std::vector<std::string> block_names() const override { return {"a", "b"}; }
  torch::nn::Linear a_{nullptr}, b_{nullptr};
};

TEST(ModelBlockHooks, CallOrderAndReturnedTensor) {
  torch::manual_seed(0);
  TwoBlocks m;
  torch::Tensor x = torch::randn({4, 3});
  torch::Tensor plain = m.forward(x);

  std::vector<std::string> calls;
  torch::Tensor seen_after_a;
  Model::BlockHooks hooks;
  hooks.before = [&](const std::string& block) { calls.push_back("before " + block); };
  hooks.after = [&](const std::string& block, torch::Tensor out) {
    calls.push_back("after " + block);
    if (block == "a") {
      seen_after_a = out.detach().clone();
      return out + 1;  // the model must continue with this, not with `out`
    }
    return out;
  };
  m.set_block_hooks(hooks);
  torch::Tensor hooked = m.forward(x);
  EXPECT_EQ(calls, (std::vector<std::string>{"before a", "after a", "before b", "after b"}));
  // `after` saw block a's own output, and block b ran on (a(x) + 1) * 2.
  EXPECT_TRUE(torch::allclose(seen_after_a, m.a_->forward(x)));
  torch::Tensor expected = m.b_->forward((m.a_->forward(x) + 1) * 2);
  EXPECT_TRUE(torch::allclose(hooked, expected));
  EXPECT_FALSE(torch::allclose(hooked, plain));

  // Only `before`: outputs unchanged. Empty hooks: removed.
  calls.clear();
  m.set_block_hooks({hooks.before, nullptr});
  EXPECT_TRUE(torch::allclose(m.forward(x), plain));
  EXPECT_EQ(calls, (std::vector<std::string>{"before a", "before b"}));
  calls.clear();
  m.set_block_hooks({});
  EXPECT_TRUE(torch::allclose(m.forward(x), plain));
  EXPECT_TRUE(calls.empty());
}

TEST(ModelBlockHooks, MnistModelsHaveNoBlocks) {
  EXPECT_TRUE(make_model("mnist-cnn")->block_names().empty());
  EXPECT_TRUE(make_model("mnist-mlp")->block_names().empty());
  EXPECT_FALSE(make_model("mnist-cnn")->takes_tokens());
}

torch::Tensor sample_input(const Model& m) {
  if (m.takes_tokens()) return torch::randint(0, 256, {2, 16}, torch::kLong);
  return torch::randn({2, 1, 28, 28});
}

// What sharded data parallelism does with the hooks: every block's parameters are "freed"
// (zeroed) outside the block, "gathered" (restored) in `before` and freed again in `after`.
// The output must equal the unsharded model's: a model that used a block's parameters
// outside run_block, or skipped a hook, would see zeros there.
TEST(ModelBlockHooks, EveryModelRunsEachBlockOnlyInsideItsHooks) {
  for (const std::string name : {"resnet-debug", "vit-debug", "gpt-debug"}) {
    SCOPED_TRACE(name);
    torch::manual_seed(0);
    auto m = make_model(name);
    m->eval();
    torch::NoGradGuard no_grad;
    torch::Tensor x = sample_input(*m);
    torch::Tensor reference = m->forward(x);

    const auto blocks = m->block_names();
    ASSERT_FALSE(blocks.empty());
    std::map<std::string, std::shared_ptr<torch::nn::Module>> modules;
    for (const auto& kv : m->named_modules())
      modules[kv.key()] = kv.value();
    std::map<std::string, std::vector<std::pair<torch::Tensor, torch::Tensor>>> saved;
    std::set<torch::TensorImpl*> in_blocks;
    for (const auto& b : blocks) {
      ASSERT_TRUE(modules.count(b)) << b << " is not a module path";
      for (auto& p : modules[b]->parameters()) {
        EXPECT_TRUE(in_blocks.insert(p.unsafeGetTensorImpl()).second) << "shared by blocks";
        saved[b].emplace_back(p, p.clone());
        p.zero_();
      }
    }
    EXPECT_LT(in_blocks.size(), m->parameters().size()) << "the stem and head are not blocks";

    std::vector<std::string> order;
    Model::BlockHooks hooks;
    hooks.before = [&](const std::string& b) {
      order.push_back(b);
      for (auto& [p, full] : saved.at(b))
        p.copy_(full);
    };
    hooks.after = [&](const std::string& b, torch::Tensor out) {
      for (auto& [p, full] : saved.at(b))
        p.zero_();
      return out;
    };
    m->set_block_hooks(hooks);
    torch::Tensor sharded = m->forward(x);
    EXPECT_EQ(order, blocks);
    EXPECT_TRUE(torch::allclose(sharded, reference, 1e-5, 1e-6))
        << (sharded - reference).abs().max().item<double>();
  }
}

}  // namespace
}  // namespace dtorch::models
