// A replicated model's checkpoint written by all of its ranks at once into the sharded format,
// each tensor by one rank (Note [Saving replicated state]), and read back by parameter name.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <string>
#include <utility>
#include <vector>

#include "dtorch/checkpoint/checkpoint.h"
#include "dtorch/checkpoint/sharded_checkpoint.h"
#include "dtorch/checkpoint/sharded_join.h"

namespace dtorch::checkpoint {

/// What rank `rank` of `world` passes to save_sharded_checkpoint for a model (and optimizer,
/// when not null) that every rank holds alike: each parameter is a unit of its own, named as
/// the parameter, written with its optimizer state by writers_by_bytes's rank; rank 0 adds
/// the buffers ("buffer/<name>"), Adam's step count ("optim/step") and the CPU generator
/// ("rng_state"). With `copy` the pieces are copies in host memory (host_snapshot), for a save
/// that runs while training goes on; without, they refer to the model and optimizer.
struct ReplicatedShare {
  ShardedCheckpointData data;
  std::vector<ShardPiece> mine;
  std::vector<std::pair<std::string, torch::Tensor>> full;
};
ReplicatedShare replicated_share(const CheckpointData& data, const torch::nn::Module& model,
                                 const torch::optim::Optimizer* optimizer, int rank, int world,
                                 bool copy);

/// Restores `model`, `optimizer` (when not null) and the CPU generator from `saved`, reading
/// each parameter by name, so whatever strategy and world size wrote it (Note [Resharding by
/// name]). Throws CheckpointError naming a parameter the checkpoint lacks or holds in another
/// shape, or optimizer state it lacks.
LoadedCheckpoint load_replicated(ShardedJoin& saved, torch::nn::Module& model,
                                 torch::optim::Optimizer* optimizer);

}  // namespace dtorch::checkpoint
