// Tests for attention's two kernels: LibTorch 2.x's fused scaled_dot_product_attention gives
// what the explicit softmax(q k^T / sqrt(d)) v gives (Note [Fused attention]), alone and inside
// gpt and vit, forward and backward.
#include "dtorch/models/attention.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dtorch/checkpoint/state_dict.h"
#include "dtorch/core/error.h"
#include "dtorch/core/torch_compat.h"
#include "dtorch/models/gpt.h"
#include "dtorch/models/vit.h"

namespace dtorch::models {
namespace {

constexpr double kTol = 1e-5;

double max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

#define SKIP_WITHOUT_FUSED_ATTENTION() \
  if (!compat::kHasFusedAttention)     \
  GTEST_SKIP() << "LibTorch " << TORCH_VERSION << " has no fused attention (needs 2.x)"

TEST(Attention, ExplicitKernelIsCausalSoftmaxAttention) {
  torch::manual_seed(0);
  auto q = torch::randn({1, 1, 3, 2}, torch::kDouble),
       k = torch::randn({1, 1, 3, 2}, torch::kDouble),
       v = torch::randn({1, 1, 3, 2}, torch::kDouble);
  auto y = attention(q, k, v, /*causal=*/true, AttentionKernel::Explicit);
  // Token 0 sees only itself; token 2 sees all three, weighted by softmax of the scores.
  EXPECT_TRUE(torch::allclose(y[0][0][0], v[0][0][0]));
  auto scores = torch::matmul(q[0][0][2], k[0][0].t()) / std::sqrt(2.0);
  EXPECT_TRUE(torch::allclose(y[0][0][2], torch::matmul(torch::softmax(scores, 0), v[0][0])));
}

TEST(Attention, FusedKernelEqualsExplicitForwardAndBackward) {
  SKIP_WITHOUT_FUSED_ATTENTION();
  torch::manual_seed(1);
  for (bool causal : {false, true}) {
    auto make = [] { return torch::randn({2, 3, 17, 8}, torch::requires_grad()); };
    auto q = make(), k = make(), v = make();
    auto g = torch::randn({2, 3, 17, 8});
    auto run = [&](AttentionKernel kernel) {
      auto y = attention(q, k, v, causal, kernel);
      auto grads = torch::autograd::grad({y}, {q, k, v}, {g});
      return std::make_pair(y.detach(), grads);
    };
    auto [ye, ge] = run(AttentionKernel::Explicit);
    auto [yf, gf] = run(AttentionKernel::Fused);
    EXPECT_LE(max_diff(ye, yf), kTol) << "causal " << causal;
    for (int i = 0; i < 3; ++i)
      EXPECT_LE(max_diff(ge[i], gf[i]), kTol) << "causal " << causal << " grad " << i;
  }
}

TEST(Attention, FusedKernelOnLibTorch1IsAClearError) {
  if (compat::kHasFusedAttention) GTEST_SKIP() << "LibTorch 2.x has the fused kernel";
  auto t = torch::zeros({1, 1, 2, 2});
  EXPECT_THROW(attention(t, t, t, false, AttentionKernel::Fused), ConfigError);
  EXPECT_THROW(parse_attention_kernel("flash"), ConfigError);
}

// The same model with each kernel: equal logits and parameter gradients.
template <typename Model, typename Config, typename Input>
void expect_kernels_agree(Config c, const Input& x) {
  c.attention = AttentionKernel::Explicit;
  Model ref(c);
  c.attention = AttentionKernel::Fused;
  Model fused(c);
  checkpoint::load_state_dict(fused, checkpoint::state_dict(ref), "the explicit model");
  auto out_ref = ref.forward(x), out_fused = fused.forward(x);
  EXPECT_LE(max_diff(out_ref, out_fused), kTol);
  out_ref.square().mean().backward();
  out_fused.square().mean().backward();
  auto pr = ref.named_parameters(), pf = fused.named_parameters();
  for (const auto& kv : pr)
    EXPECT_LE(max_diff(kv.value().grad(), pf[kv.key()].grad()), kTol) << kv.key();
}

TEST(Attention, GptDebugGivesTheSameLogitsAndGradientsWithEitherKernel) {
  SKIP_WITHOUT_FUSED_ATTENTION();
  torch::manual_seed(2);
  expect_kernels_agree<GPT>(GPTConfig::debug(), torch::randint(0, 256, {3, 32}, torch::kLong));
}

TEST(Attention, VitDebugGivesTheSameLogitsAndGradientsWithEitherKernel) {
  SKIP_WITHOUT_FUSED_ATTENTION();
  torch::manual_seed(3);
  expect_kernels_agree<VisionTransformer>(ViTConfig::debug(), torch::randn({4, 1, 28, 28}));
}

}  // namespace
}  // namespace dtorch::models
