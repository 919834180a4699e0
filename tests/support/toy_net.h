// A user's model as a test would write one: LibTorch modules only, its blocks run through
// models::call() (Note [Your own model]); nothing else of dtorch in it.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <atomic>
#include <string>

#include "dtorch/models/module_hooks.h"

namespace dtorch::testing {

struct ToyBlockImpl : torch::nn::Module {
  explicit ToyBlockImpl(int64_t width) {
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})));
    up = register_module("up", torch::nn::Linear(width, 2 * width));
    down = register_module("down", torch::nn::Linear(2 * width, width));
  }
  torch::Tensor forward(torch::Tensor x) {
    ++runs;
    // Through call(), so that tensor parallelism can split them (Note [Module hooks]).
    return x + models::call(down, torch::gelu(models::call(up, norm(x))));
  }
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear up{nullptr}, down{nullptr};
  std::atomic<int> runs{0};  ///< forwards run, recomputations included
};
TORCH_MODULE(ToyBlock);

/// in (inputs -> width), `depth` residual blocks, out (width -> outputs).
struct ToyNet : torch::nn::Module {
  ToyNet(int64_t inputs, int64_t width, int64_t depth, int64_t outputs) {
    in = register_module("in", torch::nn::Linear(inputs, width));
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < depth; ++i)
      blocks->push_back(ToyBlock(width));
    out = register_module("out", torch::nn::Linear(width, outputs));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = models::call(in, x);  // a pipeline unit, as below (Note [Pipeline units of your own model])
    for (size_t i = 0; i < blocks->size(); ++i) {
      auto block = blocks->ptr<ToyBlockImpl>(i);
      x = models::call(block, x);  // the one line a unit needs
    }
    return models::call(out, x);
  }
  torch::nn::Linear in{nullptr}, out{nullptr};
  torch::nn::ModuleList blocks{nullptr};
};

}  // namespace dtorch::testing
