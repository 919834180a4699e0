// Tensor-parallel layouts, <out>/tensor_parallel.json (Note [Tensor-parallel checkpoints] in
// train/strategy/ddp_strategy.cpp): the input is the file, beside the tp0-of-2 and tp1-of-2 sharded
// checkpoints of a gpt-debug ZeRO-1 run under --tp 2 (the fixture), joined by `dtorch checkpoint
// consolidate` (checkpoint/consolidate.cpp).
#include <cstdint>

#include "consolidate_target.h"

DTORCH_FUZZ_TARGET(tensor_parallel_layout) {
  using namespace dtorch;
  static const std::string run = fuzz::folder_of_links("run", fuzz::fixture("tensor_parallel"));
  fuzz::write_file(paths::join(run, "tensor_parallel.json"), data, size);
  return fuzz::accept_errors([&] { fuzz::inspect_and_consolidate(run, false); });
}
