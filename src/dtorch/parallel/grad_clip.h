// Gradient clipping by the norm of the whole gradient, computed and applied on the gradients'
// device: DDP's replicated gradients, ZeRO's shards and a pipeline's stages share it.
#pragma once

#include <ATen/ATen.h>

#include <vector>

namespace dtorch::parallel {

/// Note [Clipping on the device]
/// torch::nn::utils::clip_grad_norm_ returns the norm as a double, so it reads it back to the
/// host and waits for the GPU's queue to drain, every step (Note [No host sync in a step] in
/// train/step_stats.h). Here the norm stays a tensor: the sum of squares is taken in float64
/// (whatever part of the gradient a rank holds, summed over its groups by the caller), the
/// coefficient max_norm / (norm + 1e-6) clamped at 1 and every gradient multiplied by it, as
/// PyTorch 2's clip_grad_norm_ does (a gradient under the limit is multiplied by exactly 1,
/// which leaves it as it was). Nothing is read on the host.

/// The sum of the squares of every element of `grads` (undefined ones skipped), a float64
/// tensor of one element on `device`.
at::Tensor sum_of_squares(const std::vector<at::Tensor>& grads, at::Device device);

/// Scales `grads` in place so that a gradient whose squared norm is `squares` (sum_of_squares,
/// summed over every rank that holds a part) has a norm of at most `max_norm`; returns that
/// norm before clipping, a 0-dim float64 tensor on squares' device (reading it waits for it).
at::Tensor clip_to_norm(const std::vector<at::Tensor>& grads, const at::Tensor& squares,
                        double max_norm);

}  // namespace dtorch::parallel
