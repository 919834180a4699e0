// What `dtorch checkpoint inspect` and `consolidate` do with a checkpoint, for the harnesses that
// fuzz the layout files those commands read.
#pragma once

#include <string>

#include "dtorch/checkpoint/checkpoint.h"
#include "dtorch/checkpoint/consolidate.h"
#include "dtorch/checkpoint/sharded_checkpoint.h"
#include "fuzz_support.h"

namespace dtorch::fuzz {

/// Reads the sharded checkpoint at `dir` and verifies its files (when `inspect`), then writes its
/// whole model to scratch()/model.pt as consolidate does.
inline void inspect_and_consolidate(const std::string& dir, bool inspect) {
  if (inspect) {
    checkpoint::ShardedCheckpointReader reader(dir);
    (void)reader.check_files();
    (void)reader.flat_tensors();
    (void)reader.full_tensors();
  }
  const checkpoint::Consolidated model = checkpoint::consolidate(dir);
  checkpoint::write_file_atomically(
      paths::join(scratch(), "model.pt"),
      checkpoint::serialize_state_dict(model.state, checkpoint::SaveFormat::Torch));
}

}  // namespace dtorch::fuzz
