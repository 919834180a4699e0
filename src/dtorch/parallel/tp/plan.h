// A tensor-parallel plan: which modules of a model are split and how (PyTorch's
// parallelize_module plan, Megatron-LM's layer choices), as plain data. Each model writes its
// own (Model::tensor_parallel_plan); this file completes it for a pipeline stage and sequence
// parallelism, and tensor_parallel.h applies it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dtorch/models/model.h"

namespace dtorch::tp {

/// The plan types are the models' (models/tensor_plan.h): each model writes its own plan.
using Style = models::TensorSplit;
using Rule = models::TensorRule;
using Plan = models::TensorPlan;

std::string to_string(Style s);

/// The plan tensor parallelism applies to `model` over `tp_size` ranks: the model's own
/// (Model::tensor_parallel_plan; a model without one is a ConfigError), with sequence
/// parallelism's boundaries at its first and last block, kept to the modules a pipeline stage
/// holds; for a models::StageUnion, every stage's.
Plan plan_for(const models::Model& model, int tp_size);

}  // namespace dtorch::tp
