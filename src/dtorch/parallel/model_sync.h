// Making every rank's replica of a model the same before parallel training starts (DDP and
// the sharded strategies both begin here).
#pragma once

#include <torch/nn/module.h>

#include <string>
#include <vector>

#include "dtorch/comm/communicator.h"

namespace dtorch::parallel {

/// Compares every rank's parameter names, shapes and dtypes with rank 0's; all ranks throw
/// ConfigError together when any differs, naming the first differing parameter. `who` names
/// the caller in messages ("DDP", "ZeRO-3").
void check_same_model(const torch::nn::Module& model, comm::Communicator& comm,
                      const std::string& who);

/// Overwrites `tensors` with rank 0's values, one broadcast per dtype and device.
void broadcast_from_rank0(const std::vector<at::Tensor>& tensors, comm::Communicator& comm,
                          const std::string& what);

}  // namespace dtorch::parallel
