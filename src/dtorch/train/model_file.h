// The model file a run ends with (--save-format): the whole model, joined from its tensor-
// parallel shards and pipeline stages, for torch.load or safetensors.
#pragma once

#include <memory>

#include "dtorch/checkpoint/state_dict.h"
#include "dtorch/comm/communicator.h"
#include "dtorch/train/config/run_config.h"
#include "dtorch/train/parallelize.h"

namespace dtorch::train {

/// Writes <c.out>/model.pt or model.safetensors on world rank 0 (atomically) from `run`'s
/// model. Collective over `world`.
void write_model_file(const TrainConfig& c, Parallelized& run, comm::Communicator& world);

}  // namespace dtorch::train
