// The interface every dtorch model implements: a torch::nn::Module with one tensor in and one
// tensor out, so trainers and parallel wrappers can drive any model the same way.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

namespace dtorch::models {

/// A model: architecture only (no training or communication code). Parameters and buffers
/// are registered under the names PyTorch's Python module of the same model uses, so state
/// dicts move between C++ and Python unchanged.
class Model : public torch::nn::Module {
 public:
  /// Maps a batch of inputs to a batch of outputs (logits for classifiers).
  virtual torch::Tensor forward(torch::Tensor x) = 0;
};

}  // namespace dtorch::models
