// Tests for the LibTorch 1.13 / 2.x compatibility header: each name means the same on both.
#include "dtorch/core/torch_compat.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dtorch/parallel/autocast.h"

namespace dtorch::compat {
namespace {

// Note [Optimizer state key]: the key finds the state the optimizer itself created, and
// seeding state under it is what the optimizer then uses.
TEST(TorchCompat, OptimizerStateKeyFindsTheOptimizersOwnState) {
  torch::Tensor a = torch::ones({3}, torch::requires_grad());
  torch::Tensor b = torch::ones({2}, torch::requires_grad());
  torch::optim::Adam adam({a, b}, torch::optim::AdamOptions(0.1));
  a.mutable_grad() = torch::full({3}, 2.0);
  b.mutable_grad() = torch::full({2}, -1.0);
  adam.step();
  ASSERT_EQ(adam.state().size(), 2u);
  auto it = adam.state().find(optimizer_state_key(a));
  ASSERT_NE(it, adam.state().end());
  auto& st = static_cast<torch::optim::AdamParamState&>(*it->second);
  EXPECT_EQ(st.step(), 1);
  // exp_avg after one step is (1 - beta1) * grad.
  EXPECT_TRUE(torch::allclose(st.exp_avg(), torch::full({3}, 0.1 * 2.0)));
  EXPECT_NE(optimizer_state_key(a), optimizer_state_key(b));

  // Seeded state is picked up: a momentum buffer of 5 makes SGD step by lr * (0.9 * 5 + g).
  torch::Tensor w = torch::zeros({1}, torch::requires_grad());
  torch::optim::SGD sgd({w}, torch::optim::SGDOptions(1.0).momentum(0.9));
  auto seeded = std::make_unique<torch::optim::SGDParamState>();
  seeded->momentum_buffer(torch::full({1}, 5.0));
  sgd.state()[optimizer_state_key(w)] = std::move(seeded);
  w.mutable_grad() = torch::ones({1});
  sgd.step();
  EXPECT_FLOAT_EQ(w.item<float>(), -(0.9f * 5.0f + 1.0f));
}

// Note [Autocast switches]: the scope turns bf16 compute on and restores what was before; an
// exact scope that is not enabled turns an enclosing one off (a recomputation of a forward
// that ran without autocast).
TEST(TorchCompat, AutocastScopeRestoresThePreviousState) {
  ASSERT_FALSE(autocast_enabled(at::kCPU));
  torch::Tensor x = torch::randn({4, 4});
  {
    parallel::Autocast scope({true, at::kCPU, at::kBFloat16});
    EXPECT_TRUE(autocast_enabled(at::kCPU));
    EXPECT_EQ(autocast_dtype(at::kCPU), at::kBFloat16);
    EXPECT_EQ(torch::mm(x, x).scalar_type(), at::kBFloat16);
    {
      parallel::Autocast off({false, at::kCPU}, /*exact=*/true);
      EXPECT_EQ(torch::mm(x, x).scalar_type(), at::kFloat);
    }
    EXPECT_EQ(torch::mm(x, x).scalar_type(), at::kBFloat16);
    parallel::Autocast nothing({false, at::kCPU});  // not exact: leaves the state alone
    EXPECT_EQ(torch::mm(x, x).scalar_type(), at::kBFloat16);
  }
  EXPECT_FALSE(autocast_enabled(at::kCPU));
  EXPECT_EQ(torch::mm(x, x).scalar_type(), at::kFloat);
}

}  // namespace
}  // namespace dtorch::compat
