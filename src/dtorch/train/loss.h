// The loss every dtorch model trains on: cross-entropy over a classifier's classes (B x C) or
// over a language model's tokens (B x T x vocab), so the trainer, benchmarks and tests share it.
#pragma once

#include <torch/nn/functional/loss.h>
#include <torch/types.h>

#include "dtorch/parallel/tp/tensor_parallel.h"

namespace dtorch::train {

/// Cross-entropy of `out` (B x C, or B x T x V) against class indices `target` (B, or B x T),
/// computed in fp32 whatever dtype the forward ran in (bf16 under autocast).
inline torch::Tensor cross_entropy(const torch::Tensor& out, const torch::Tensor& target,
                                   at::Reduction::Reduction r = at::Reduction::Mean) {
  return torch::cross_entropy_loss(out.reshape({-1, out.size(-1)}).to(torch::kFloat),
                                   target.reshape({-1}), {}, r);
}

/// The mean cross-entropy above, or its vocabulary-parallel form when tensor parallelism (`tp`,
/// may be null) left the logits split by vocabulary.
inline torch::Tensor cross_entropy(const torch::Tensor& out, const torch::Tensor& target,
                                   const tp::TensorParallel* tp) {
  if (tp && tp->vocab_parallel_output()) return tp->vocab_cross_entropy(out, target);
  return cross_entropy(out, target);
}

}  // namespace dtorch::train
