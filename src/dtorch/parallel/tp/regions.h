// The autograd functions that move activations into and out of a tensor-parallel region
// (Megatron-LM's mappings.py): each is a collective in one direction and its adjoint in the
// other, so that forward and backward both stay correct with every rank holding a part.
#pragma once

#include <torch/types.h>

#include <memory>

#include "dtorch/comm/communicator.h"

namespace dtorch::tp {

using CommPtr = std::shared_ptr<comm::Communicator>;

/// Note [Tensor-parallel regions]: inside a region each rank holds a slice of the features
/// (column-parallel output, row-parallel input); outside, the activation is whole on every
/// rank, or, with sequence parallelism, a slice of the sequence (dim 1 of B x T x d).
///   copy_to_region           forward: identity            backward: allreduce
///   reduce_from_region       forward: allreduce           backward: identity
///   scatter_to_sequence      forward: keep my T/n slice   backward: allgather along T
///   gather_from_sequence     forward: allgather along T   backward: reduce-scatter along T
///                            (or, grad_is_partial false: keep my slice of the gradient)
///   reduce_scatter_to_sequence forward: reduce-scatter along T  backward: allgather along T
/// Megatron's f and g are the first two; the sequence-parallel forms replace each allreduce
/// by a reduce-scatter plus an allgather of the same bytes.
torch::Tensor copy_to_region(const torch::Tensor& x, const CommPtr& tp);
torch::Tensor reduce_from_region(const torch::Tensor& x, const CommPtr& tp);
torch::Tensor scatter_to_sequence(const torch::Tensor& x, const CommPtr& tp);
torch::Tensor gather_from_sequence(const torch::Tensor& x, const CommPtr& tp,
                                   bool grad_is_partial = true);
torch::Tensor reduce_scatter_to_sequence(const torch::Tensor& x, const CommPtr& tp);

/// Mean cross-entropy of `logits` (N x V/n, this rank's vocabulary rows vocab_start ..
/// vocab_start + V/n) against `target` (N token ids over the whole vocabulary), computed in
/// float32 with two allreduces of N values (row maxima; sums of exponentials and target
/// logits) instead of gathering N x V logits. Backward is local: softmax minus one-hot.
torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits, const torch::Tensor& target,
                                           const CommPtr& tp, int64_t vocab_start);

}  // namespace dtorch::tp
