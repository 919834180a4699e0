// Test helper for the parity chain: a reference and the model under test, trained side by side.
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cmath>

namespace dtorch::testing {

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
