// Pipeline layouts, <out>/pipeline.json (Note [Pipeline checkpoints]): the input is the file,
// beside the stage folders of two gpt-debug runs under --pp 2 (DDP's pp0-of-2, pp1-of-2 and
// interleaved ZeRO-1's pp0-of-4, pp1-of-4: the fixture); read_pipeline_layout reads it, then
// `dtorch checkpoint consolidate` joins the stages it names.
#include <cstdint>

#include "consolidate_target.h"
#include "dtorch/checkpoint/pipeline_checkpoint.h"

DTORCH_FUZZ_TARGET(pipeline_layout) {
  using namespace dtorch;
  static const std::string run = fuzz::folder_of_links("run", fuzz::fixture("pipeline"));
  fuzz::write_file(paths::join(run, "pipeline.json"), data, size);
  return fuzz::accept_errors([&] {
    (void)checkpoint::read_pipeline_layout(run);
    fuzz::inspect_and_consolidate(run, false);
  });
}
