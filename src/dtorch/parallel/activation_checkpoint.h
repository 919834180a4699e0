// Activation checkpointing applied to a model: its blocks keep only their inputs in forward and
// run again during backward, trading one more forward for the activations inside each block
// (Note [Activation checkpointing]).
//   parallel::checkpoint_activations(*model, {/*every=*/1});   // before the strategy wraps it
#pragma once

#include "dtorch/models/model.h"

namespace dtorch::parallel {

struct ActivationCheckpointing {
  /// Checkpoint blocks 0, every, 2 * every, ... of the model's block_names() (1: every block;
  /// counted within each pipeline stage). 0 turns checkpointing off.
  int every = 1;
};

/// Note [Activation checkpointing]: a checkpointed block runs its forward without recording a
/// graph and keeps its input, its parameters and the random-number and autocast state it ran
/// with. In backward it restores that state, runs the forward again with a graph, and takes
/// the gradients of its input and of its parameters from it with torch::autograd::grad (which
/// accumulates nothing), returning them as the block's gradients; the engine accumulates the
/// parameters' as for any other node, so DDP's and ZeRO's gradient hooks fire once, as
/// without checkpointing, and the gradients are the same. The parameters are inputs of the
/// block's autograd node, so the node holds every parameter's edge. The forward runs between
/// the block hooks (Note [Block hooks]): ZeRO-3 has gathered the parameters before the
/// recomputation needs them, by its pre-backward gather. Buffers the recomputation updates
/// (BatchNorm's running statistics) are put back, so they move once per forward, as without
/// checkpointing. Tensor parallelism's forward collectives run again in the recomputation,
/// on every rank of the group alike (as Megatron-LM's recomputation does). A tensor hook on a
/// parameter, though, runs on the gradient torch::autograd::grad takes as well (LibTorch 2.x),
/// and then again as the engine accumulates it: a hook that must see each gradient once (tensor
/// parallelism's partial sums) passes it through while taking_block_gradients().
///
/// Installs a block runner on `model` (on each stage of a models::StageUnion) that checkpoints
/// the blocks `opts` selects; every = 0 removes it. ConfigError when every < 0 or the model
/// names no blocks.
void checkpoint_activations(models::Model& model, ActivationCheckpointing opts);

/// Whether this thread is taking a checkpointed block's gradients, within its backward (Note
/// [Activation checkpointing]).
bool taking_block_gradients();

}  // namespace dtorch::parallel
