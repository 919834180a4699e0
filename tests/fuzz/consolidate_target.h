// `dtorch checkpoint inspect` and `consolidate` as the command line runs them, for the harnesses
// that fuzz the layout files those commands read: tools/cmd_checkpoint.cpp is compiled into the
// harness, because the tensor-parallel layout's reader is private to it.
#pragma once

#include <iostream>
#include <string>

#include "fuzz_support.h"
#include "tools/cmd_checkpoint.cpp"

namespace dtorch::fuzz {

/// `dtorch checkpoint inspect DIR` (when `inspect`), then `dtorch checkpoint consolidate DIR
/// scratch()/model.pt`, their printing thrown away.
inline void inspect_and_consolidate(const std::string& dir, bool inspect) {
  static const bool quiet = [] {
    std::cout.rdbuf(nullptr);
    return true;
  }();
  (void)quiet;
  tools::CheckpointFlags f;
  f.dir = dir;
  f.out = paths::join(scratch(), "model.pt");
  if (inspect) (void)tools::run_inspect(f);
  (void)tools::run_consolidate(f);
}

}  // namespace dtorch::fuzz
