// The two MNIST models of the Python peer (bench/peer_ddp_mnist.py), layer for layer and
// name for name, so results and checkpoints compare across the two implementations.
#pragma once

#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include "dtorch/models/model.h"

namespace dtorch::models {

/// "mnist-cnn", the peer's Net (PyTorch's classic MNIST example without dropout):
/// conv1 3x3 1->32, conv2 3x3 32->64, 2x2 max-pool, fc1 9216->128, fc2 128->10, ReLUs.
/// Input N x 1 x 28 x 28, output N x 10 logits; another ImageInput changes conv1's input
/// channels, fc1's width (64 x ((size - 4) / 2)^2) and fc2's classes.
class MnistCnn : public Model {
 public:
  explicit MnistCnn(const ImageInput& input = {});
  torch::Tensor forward(torch::Tensor x) override;
  bool scopes_forward() const override { return true; }

 private:
  torch::nn::Conv2d conv1_{nullptr}, conv2_{nullptr};
  torch::nn::Linear fc1_{nullptr}, fc2_{nullptr};
};

/// "mnist-mlp", the peer's MLP: fc1 784->256, fc2 256->256, fc3 256->10, ReLUs.
/// Input N x 1 x 28 x 28 (or N x 784), output N x 10 logits; another ImageInput changes
/// fc1's width (channels x size^2) and fc3's classes.
class MnistMlp : public Model {
 public:
  explicit MnistMlp(const ImageInput& input = {});
  torch::Tensor forward(torch::Tensor x) override;
  bool scopes_forward() const override { return true; }

 private:
  torch::nn::Linear fc1_{nullptr}, fc2_{nullptr}, fc3_{nullptr};
};

}  // namespace dtorch::models
