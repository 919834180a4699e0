// Random batches for the tests that train a model several ways and compare.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <utility>

#include "dtorch/models/model.h"

namespace dtorch::testing {

/// Inputs and targets for `m` from seed `seed`: 2 x 16 token ids below 256 for a model that
/// takes tokens, else 4 images of 1 x 28 x 28 and their labels below 10.
inline std::pair<torch::Tensor, torch::Tensor> random_batch(const models::Model& m, uint64_t seed) {
  torch::manual_seed(seed);
  if (m.takes_tokens()) {
    auto x = torch::randint(0, 256, {2, 16}, torch::kLong);
    return {x, torch::randint(0, 256, {2, 16}, torch::kLong)};
  }
  return {torch::randn({4, 1, 28, 28}), torch::randint(0, 10, {4}, torch::kLong)};
}

}  // namespace dtorch::testing
