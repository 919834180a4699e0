// Test helper for the parity chain: a reference and the model under test, trained side by side.
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>

#include <cmath>
#include <memory>
#include <vector>

namespace dtorch::testing {

/// Plain SGD at `lr` over whatever tensors it is given: a model's parameters, or ZeRO's
/// OptimizerFactory over its master shards.
inline auto plain_sgd(double lr) {
  return [lr](std::vector<torch::Tensor> params) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(lr));
  };
}

/// One optimizer step of the reference and one of the model under test, each on the loss its
/// function computes (forward included); returns how far apart the two losses were.
template <class RefLoss, class Loss>
double step_side_by_side(torch::optim::Optimizer& ref_opt, RefLoss&& ref_loss,
                         torch::optim::Optimizer& opt, Loss&& loss) {
  ref_opt.zero_grad();
  torch::Tensor a = ref_loss();
  a.backward();
  ref_opt.step();
  opt.zero_grad();
  torch::Tensor b = loss();
  b.backward();
  opt.step();
  return std::abs(b.item<double>() - a.item<double>());
}

}  // namespace dtorch::testing
