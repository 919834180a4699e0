// One training step of a run that train::parallelize assembled: forward, loss, backward and the
// optimizer's update, or a pipeline's schedule over micro-batches, whichever the layout holds.
// `dtorch train` steps through it, and so can a program of your own.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>

#include "dtorch/train/parallelize.h"

namespace dtorch::train {

/// How step() runs a batch.
struct StepOptions {
  double clip_grad_norm = 0;  ///< clip the whole gradient to this norm (0: no clipping)
  /// Batches whose gradients one update takes (without a pipeline): the loss is divided by
  /// it, and `update` says whether this batch is the last of them.
  int64_t accum_steps = 1;
  bool update = true;
  /// Called after each phase ("forward", "backward", "forward_backward", "step"); may be empty.
  std::function<void(const char* phase)> lap;
  /// Called just before the optimizer's update (to set a schedule's learning rate); may be
  /// empty.
  std::function<void()> before_update;
};

/// One batch of `run` on this rank: its part of the batch (x, y) (the dp group's share; under
/// context parallelism this rank's tokens are taken here), the forward under the strategy's
/// autocast, the cross-entropy (vocabulary-parallel where tensor parallelism split the head),
/// backward, and with `update` the clipped optimizer step. Under a pipeline the schedule runs
/// every micro-batch (Note [Pipeline execution]) and the step always updates. Returns the
/// batch's loss as a 0-dim tensor that nothing reads on the host (Note [No host sync in a
/// step]), the same on every rank of a pipeline. Collective over the run's groups.
torch::Tensor step(const Parallelized& run, const torch::Tensor& x, const torch::Tensor& y,
                   const StepOptions& options = {});

}  // namespace dtorch::train
