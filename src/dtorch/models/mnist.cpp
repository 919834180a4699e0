// MNIST model code. Layers are constructed in the peer's order, so with the same seed the
// default initialisation draws the same random numbers as Python's.
#include "dtorch/models/mnist.h"

#include <torch/nn/functional.h>

namespace dtorch::models {

namespace F = torch::nn::functional;

MnistCnn::MnistCnn() {
  conv1_ =
      register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 32, 3).stride(1)));
  conv2_ =
      register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3).stride(1)));
  fc1_ = register_module("fc1", torch::nn::Linear(9216, 128));
  fc2_ = register_module("fc2", torch::nn::Linear(128, 10));
}

torch::Tensor MnistCnn::forward(torch::Tensor x) {
  x = torch::relu(conv1_->forward(x));
  x = torch::max_pool2d(torch::relu(conv2_->forward(x)), 2);
  x = torch::flatten(x, 1);
  return fc2_->forward(torch::relu(fc1_->forward(x)));
}

MnistMlp::MnistMlp() {
  fc1_ = register_module("fc1", torch::nn::Linear(784, 256));
  fc2_ = register_module("fc2", torch::nn::Linear(256, 256));
  fc3_ = register_module("fc3", torch::nn::Linear(256, 10));
}

torch::Tensor MnistMlp::forward(torch::Tensor x) {
  x = torch::flatten(x, 1);
  return fc3_->forward(torch::relu(fc2_->forward(torch::relu(fc1_->forward(x)))));
}

}  // namespace dtorch::models
