// Moving a tensor-parallel model's optimizer state to and from the unsplit model's layout, so
// that a checkpoint written at one tp degree resumes at any other (Note [Tensor-parallel
// checkpoints] in train/strategy/ddp_strategy.cpp).
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "dtorch/parallel/tp/tensor_parallel.h"

namespace dtorch::tp {

/// Fills `full_opt` (an optimizer of the same kind over `full`, the unsplit model) with the
/// state of `local_opt` over `local` (this rank's tp shards): per-parameter tensors shaped
/// like their parameter (Adam's moments, SGD's momentum) are gathered from every tp rank,
/// scalars (step counts) copied. Parameters are matched by name. Collective over the group.
void gather_optimizer_state(const TensorParallel& tp, torch::nn::Module& local,
                            const torch::optim::Optimizer& local_opt, torch::nn::Module& full,
                            torch::optim::Optimizer& full_opt);

/// The inverse: sets `local_opt`'s state to this rank's shards of `full_opt`'s. Local.
void shard_optimizer_state(const TensorParallel& tp, torch::nn::Module& full,
                           const torch::optim::Optimizer& full_opt, torch::nn::Module& local,
                           torch::optim::Optimizer& local_opt);

}  // namespace dtorch::tp
