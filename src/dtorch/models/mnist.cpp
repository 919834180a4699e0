// MNIST model code. Layers are constructed in the peer's order, so with the same seed the
// default initialisation draws the same random numbers as Python's.
#include "dtorch/models/mnist.h"

#include <torch/nn/functional.h>

#include "dtorch/models/module_hooks.h"

namespace dtorch::models {

namespace F = torch::nn::functional;

MnistCnn::MnistCnn(const ImageInput& in) {
  DTORCH_CHECK_T(ConfigError, in.size >= 6, "mnist-cnn needs images of at least 6x6 pixels (",
                 "got ", in.size, "): raise --image-size");
  const int64_t pooled = (in.size - 4) / 2;
  conv1_ = register_module(
      "conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(in.channels, 32, 3).stride(1)));
  conv2_ =
      register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3).stride(1)));
  fc1_ = register_module("fc1", torch::nn::Linear(64 * pooled * pooled, 128));
  fc2_ = register_module("fc2", torch::nn::Linear(128, in.classes));
}

torch::Tensor MnistCnn::forward(torch::Tensor x) {
  return run_forward(std::move(x), [this](torch::Tensor x) {
    x = torch::relu(call(conv1_, x));
    x = torch::max_pool2d(torch::relu(call(conv2_, x)), 2);
    x = torch::flatten(x, 1);
    return call(fc2_, torch::relu(call(fc1_, x)));
  });
}

MnistMlp::MnistMlp(const ImageInput& in) {
  fc1_ = register_module("fc1", torch::nn::Linear(in.channels * in.size * in.size, 256));
  fc2_ = register_module("fc2", torch::nn::Linear(256, 256));
  fc3_ = register_module("fc3", torch::nn::Linear(256, in.classes));
}

torch::Tensor MnistMlp::forward(torch::Tensor x) {
  return run_forward(std::move(x), [this](torch::Tensor x) {
    x = torch::flatten(x, 1);
    return call(fc3_, torch::relu(call(fc2_, torch::relu(call(fc1_, x)))));
  });
}

}  // namespace dtorch::models
