// The whole model of a run's checkpoint as one state dict, whatever layout wrote it: a whole-model
// .dtc file, a sharded step folder, one sharded checkpoint per tensor-parallel index
// (tensor_parallel.json) or one checkpoint per pipeline stage (pipeline.json). `dtorch checkpoint
// consolidate` writes what it returns.
#pragma once

#include <string>

#include "dtorch/checkpoint/checkpoint.h"
#include "dtorch/checkpoint/state_dict.h"

namespace dtorch::checkpoint {

/// A model read back whole: its tensors, the epoch, step and metadata of the checkpoint they came
/// from, and that checkpoint in words for a message ("DIR/step-000004", "2 pipeline stage
/// folder(s) DIR/pp0-of-2 ...").
struct Consolidated {
  StateDict state;
  CheckpointData data;
  std::string source;
};

/// Reads the model of the checkpoint at `path`: a run's checkpoint directory (its newest intact
/// checkpoint), a step-NNNNNN folder, or a checkpoint-NNNNNN.dtc file. Throws CheckpointError
/// naming the file at fault and the fix when a file is missing, damaged or disagrees with another.
Consolidated consolidate(const std::string& path);

}  // namespace dtorch::checkpoint
