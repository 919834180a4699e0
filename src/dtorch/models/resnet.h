// ResNet-18/50 with torchvision's parameter and buffer names and a small-image stem, so the
// tutorials' CNN runs on Fashion-MNIST and its state dict loads into torchvision's resnet.
#pragma once

#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dtorch/models/model.h"

namespace dtorch::models {

/// Shape of a ResNet. Stage s (1-based) has `blocks[s-1]` residual blocks of width
/// `width << (s-1)` planes; the first block of every stage after the first halves the
/// spatial size (stride 2 on its 3x3 conv, as torchvision v1.5 does).
struct ResNetConfig {
  /// Bottleneck blocks (1x1, 3x3, 1x1, expansion 4: resnet50) or basic blocks (two 3x3,
  /// expansion 1: resnet18).
  bool bottleneck = false;
  /// Blocks per stage; one entry per stage ("layer1", "layer2", ...).
  std::vector<int64_t> blocks = {2, 2, 2, 2};
  /// Planes of the first stage (torchvision: 64).
  int64_t width = 64;
  /// Input image channels (1: Fashion-MNIST).
  int64_t in_channels = 1;
  int64_t num_classes = 10;
  /// torchvision's own stem (conv1 7x7 stride 2, then a 3x3 stride-2 max-pool) instead of the
  /// small-image one: what ImageNet-sized inputs take (the registry picks it for images of at
  /// least kImageNetStemFrom pixels).
  bool imagenet_stem = false;
  static constexpr int64_t kImageNetStemFrom = 64;

  static ResNetConfig resnet18() { return {}; }
  static ResNetConfig resnet50() { return {true, {3, 4, 6, 3}, 64, 1, 10}; }
  /// Same code, one basic block per stage and 8..64 planes: a step takes milliseconds.
  static ResNetConfig debug() { return {false, {1, 1, 1, 1}, 8, 1, 10}; }
};

/// One residual block: torchvision's BasicBlock (conv1, bn1, conv2, bn2) or Bottleneck
/// (conv1..3, bn1..3), plus `downsample` (0: 1x1 conv, 1: batch norm) when the shortcut
/// changes shape.
class ResidualBlockImpl : public torch::nn::Module {
 public:
  ResidualBlockImpl(bool bottleneck, int64_t in_planes, int64_t planes, int64_t stride);
  torch::Tensor forward(torch::Tensor x);
  /// Output channels per input plane: 4 for bottleneck blocks, else 1.
  static int64_t expansion(bool bottleneck) { return bottleneck ? 4 : 1; }

 private:
  torch::nn::Conv2d conv1_{nullptr}, conv2_{nullptr}, conv3_{nullptr};
  torch::nn::BatchNorm2d bn1_{nullptr}, bn2_{nullptr}, bn3_{nullptr};
  torch::nn::Sequential downsample_{nullptr};  // shortcut_conv_, shortcut_bn_
  torch::nn::Conv2d shortcut_conv_{nullptr};
  torch::nn::BatchNorm2d shortcut_bn_{nullptr};
};
TORCH_MODULE(ResidualBlock);

/// "resnet18", "resnet50", "resnet-debug": torchvision's ResNet (names conv1, bn1,
/// layer1.0.conv1, layer2.0.downsample.0, ..., fc) with, for images under 64 pixels, the
/// small-image stem that CIFAR ResNets use: conv1 is 3x3 stride 1 (not 7x7 stride 2) and there
/// is no max-pool, so a 28x28 input still has 4x4 pixels left in the last stage. The torchvision
/// equivalent is resnet18(num_classes=10) with conv1 = Conv2d(1, 64, 3, 1, 1, bias=False) and
/// maxpool = Identity(). With ResNetConfig::imagenet_stem (images of 64 pixels and more) it is
/// torchvision's resnet itself. Input B x in_channels x H x W, output B x num_classes logits.
/// Initialised as torchvision does (Kaiming-normal fan-out convs, BN weight 1 and bias 0),
/// each unit from its own seed (Note [Unit seeds]).
///
/// Pipeline units (Note [Pipeline units]): "stem" (conv1, bn1, relu), one per stage
/// ("layer1", ...), "head" (average pool, fc).
class ResNet : public Model {
 public:
  explicit ResNet(const ResNetConfig& config, UnitRange units = {});
  torch::Tensor forward(torch::Tensor x) override;
  bool scopes_forward() const override { return true; }
  /// The stages this instance holds: "layer1", "layer2", ...
  std::vector<std::string> block_names() const override;
  std::vector<std::string> unit_names() const override;
  const ResNetConfig& config() const { return config_; }

 private:
  ResNetConfig config_;
  torch::nn::Conv2d conv1_{nullptr};
  torch::nn::BatchNorm2d bn1_{nullptr};
  std::vector<torch::nn::Sequential> stages_;
  size_t first_stage_ = 0;  // index of stages_[0] among the model's stages
  torch::nn::Linear fc_{nullptr};

  // forward() between the forward hooks: this instance's units in order.
  torch::Tensor run_units(torch::Tensor x);
};

}  // namespace dtorch::models
