// ResNet code: torchvision's blocks and stage layout, the small-image stem, torchvision's
// initialisation. Every stage runs through run_block so sharding code can gather it alone.
#include "dtorch/models/resnet.h"

#include <torch/nn/init.h>

#include <algorithm>

#include "dtorch/core/error.h"
#include "dtorch/models/module_hooks.h"
#include "dtorch/models/unit_seeds.h"

namespace dtorch::models {
namespace nn = torch::nn;

namespace {

nn::Conv2d conv(int64_t in, int64_t out, int64_t kernel, int64_t stride) {
  return nn::Conv2d(
      nn::Conv2dOptions(in, out, kernel).stride(stride).padding(kernel / 2).bias(false));
}

}  // namespace

ResidualBlockImpl::ResidualBlockImpl(bool bottleneck, int64_t in_planes, int64_t planes,
                                     int64_t stride) {
  const int64_t out_planes = planes * expansion(bottleneck);
  if (bottleneck) {
    conv1_ = register_module("conv1", conv(in_planes, planes, 1, 1));
    bn1_ = register_module("bn1", nn::BatchNorm2d(planes));
    conv2_ = register_module("conv2", conv(planes, planes, 3, stride));
    bn2_ = register_module("bn2", nn::BatchNorm2d(planes));
    conv3_ = register_module("conv3", conv(planes, out_planes, 1, 1));
    bn3_ = register_module("bn3", nn::BatchNorm2d(out_planes));
  } else {
    conv1_ = register_module("conv1", conv(in_planes, planes, 3, stride));
    bn1_ = register_module("bn1", nn::BatchNorm2d(planes));
    conv2_ = register_module("conv2", conv(planes, planes, 3, 1));
    bn2_ = register_module("bn2", nn::BatchNorm2d(planes));
  }
  if (stride != 1 || in_planes != out_planes) {
    // torchvision's names (downsample.0, downsample.1); forward runs the two layers itself.
    shortcut_conv_ = conv(in_planes, out_planes, 1, stride);
    shortcut_bn_ = nn::BatchNorm2d(out_planes);
    downsample_ = register_module("downsample", nn::Sequential(shortcut_conv_, shortcut_bn_));
  }
}

torch::Tensor ResidualBlockImpl::forward(torch::Tensor x) {
  const torch::Tensor identity = downsample_ ? call(shortcut_bn_, call(shortcut_conv_, x)) : x;
  torch::Tensor out = torch::relu(call(bn1_, call(conv1_, x)));
  out = call(bn2_, call(conv2_, out));
  if (conv3_) out = call(bn3_, call(conv3_, torch::relu(out)));
  return torch::relu(out + identity);
}

namespace {

/// torchvision's ResNet.__init__ initialisation on one unit; fc keeps Linear's default.
void init_unit(nn::Module& unit) {
  torch::NoGradGuard no_grad;
  for (auto& m : unit.modules(/*include_self=*/true)) {
    if (auto* c = m->as<nn::Conv2d>()) {
      nn::init::kaiming_normal_(c->weight, 0.0, torch::kFanOut, torch::kReLU);
    } else if (auto* bn = m->as<nn::BatchNorm2d>()) {
      nn::init::ones_(bn->weight);
      nn::init::zeros_(bn->bias);
    }
  }
}

}  // namespace

ResNet::ResNet(const ResNetConfig& config, UnitRange units) : config_(config) {
  DTORCH_CHECK_T(ConfigError, !config.blocks.empty() && config.width > 0,
                 "ResNet needs at least one stage and a positive width");
  set_units(units);
  UnitSeeds seeds(*this);
  if (holds_unit(0)) {
    seeds.enter(0);
    conv1_ = register_module("conv1", config.imagenet_stem
                                          ? conv(config.in_channels, config.width, 7, 2)
                                          : conv(config.in_channels, config.width, 3, 1));
    bn1_ = register_module("bn1", nn::BatchNorm2d(config.width));
    init_unit(*conv1_);
    init_unit(*bn1_);
  }
  int64_t in_planes = config.width;
  first_stage_ = static_cast<size_t>(std::max(0, this->units().begin - 1));
  for (size_t s = 0; s < config.blocks.size(); ++s) {
    DTORCH_CHECK_T(ConfigError, config.blocks[s] > 0, "ResNet stage ", s + 1, " has no blocks");
    const int64_t planes = config.width << s;
    const int64_t out_planes = planes * ResidualBlockImpl::expansion(config.bottleneck);
    if (!holds_unit(static_cast<int>(s) + 1)) {
      in_planes = out_planes;
      continue;
    }
    seeds.enter(static_cast<int>(s) + 1);
    nn::Sequential stage;
    for (int64_t b = 0; b < config.blocks[s]; ++b) {
      const int64_t stride = (s > 0 && b == 0) ? 2 : 1;
      stage->push_back(ResidualBlock(config.bottleneck, in_planes, planes, stride));
      in_planes = out_planes;
    }
    init_unit(*stage);
    stages_.push_back(register_module("layer" + std::to_string(s + 1), stage));
  }
  const int head = static_cast<int>(config.blocks.size()) + 1;
  if (holds_unit(head)) {
    seeds.enter(head);
    fc_ = register_module("fc", nn::Linear(in_planes, config.num_classes));
  }
  seeds.finish(num_units());
}

torch::Tensor ResNet::forward(torch::Tensor x) {
  return run_forward(std::move(x), [this](torch::Tensor x) { return run_units(std::move(x)); });
}

torch::Tensor ResNet::run_units(torch::Tensor x) {
  if (holds_unit(0)) {
    x = torch::relu(call(bn1_, call(conv1_, x)));
    if (config_.imagenet_stem) x = torch::max_pool2d(x, 3, 2, 1);
  }
  const auto names = block_names();
  for (size_t s = 0; s < stages_.size(); ++s)
    x = run_block(names[s], x, [this, s](torch::Tensor t) { return stages_[s]->forward(t); });
  if (!fc_) return x;
  x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
  return call(fc_, x);
}

std::vector<std::string> ResNet::block_names() const {
  std::vector<std::string> names;
  for (size_t s = 0; s < stages_.size(); ++s)
    names.push_back("layer" + std::to_string(first_stage_ + s + 1));
  return names;
}

std::vector<std::string> ResNet::unit_names() const {
  std::vector<std::string> names = {"stem"};
  for (size_t s = 0; s < config_.blocks.size(); ++s)
    names.push_back("layer" + std::to_string(s + 1));
  names.push_back("head");
  return names;
}

}  // namespace dtorch::models
