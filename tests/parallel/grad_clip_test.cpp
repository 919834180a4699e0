// Note [Clipping on the device]: the norm and the clipped gradients against LibTorch's own
// clip_grad_norm_, above and below the limit.
#include "dtorch/parallel/grad_clip.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dtorch/core/error.h"

namespace dtorch::parallel {
namespace {

TEST(GradClip, MatchesClipGradNormOfLibTorch) {
  torch::manual_seed(2);
  for (double max_norm : {0.5, 1e3}) {
    std::vector<torch::Tensor> ours, theirs;
    for (auto shape : {std::vector<int64_t>{7, 3}, {11}, {2, 2, 5}}) {
      auto p = torch::randn(shape, torch::requires_grad());
      p.mutable_grad() = torch::randn(shape);
      theirs.push_back(p);
      ours.push_back(p.grad().clone());
    }
    ours.push_back(torch::Tensor());  // a parameter without gradient is skipped
    const double want = torch::nn::utils::clip_grad_norm_(theirs, max_norm);
    const std::vector<torch::Tensor> before = {ours[0].clone(), ours[1].clone(), ours[2].clone()};
    const torch::Tensor norm = clip_to_norm(ours, sum_of_squares(ours, at::kCPU), max_norm);
    EXPECT_EQ(norm.dim(), 0);
    EXPECT_EQ(norm.scalar_type(), at::kDouble);
    EXPECT_NEAR(norm.item<double>(), want, 1e-6 * want);
    for (size_t i = 0; i < theirs.size(); ++i) {
      EXPECT_TRUE(torch::allclose(ours[i], theirs[i].grad(), 1e-6, 1e-7)) << i;
      if (max_norm > want) EXPECT_TRUE(ours[i].equal(before[i])) << "under the limit: unchanged";
    }
  }
  std::vector<torch::Tensor> none;
  EXPECT_THROW(clip_to_norm(none, torch::zeros({1}, torch::kDouble), 0), ConfigError);
}

}  // namespace
}  // namespace dtorch::parallel
