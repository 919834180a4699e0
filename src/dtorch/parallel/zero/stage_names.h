// Data parallelism's names at each ZeRO stage. Apart from zero.h so that a run's plain settings
// (train/config/) name them without the communicator.
#pragma once

#include <string>
#include <vector>

namespace dtorch::zero {

/// Data parallelism's name at each ZeRO stage (0: none, DDP) as flags, plans and machine files
/// spell it: ddp, zero1, zero2, zero3.
inline const std::vector<std::string>& stage_names() {
  static const std::vector<std::string> names{"ddp", "zero1", "zero2", "zero3"};
  return names;
}

}  // namespace dtorch::zero
