// Sharded checkpoints' metadata.json (Note [Sharded checkpoint format]): the input is the file,
// in a step folder beside the real shard files of a gpt-debug ZeRO-1 run on two ranks (the
// fixture), so a well-formed metadata.json describes files that are there; then the folder is
// inspected and consolidated as `dtorch checkpoint inspect|consolidate` do.
#include <cstdint>

#include "consolidate_target.h"

DTORCH_FUZZ_TARGET(sharded_metadata) {
  using namespace dtorch;
  static const std::string step = [] {
    const std::string run = paths::join(fuzz::scratch(), "run");
    paths::create_directories(run);
    const std::string dir = paths::join(run, "step-000001");
    const std::string fixture = fuzz::fixture("sharded");
    paths::create_directories(dir);
    for (const std::string& name : paths::list_directory(fixture))
      if (name != "metadata.json")
        paths::create_symlink(paths::join(fixture, name), paths::join(dir, name));
    return dir;
  }();
  fuzz::write_file(paths::join(step, "metadata.json"), data, size);
  return fuzz::accept_errors([&] { fuzz::inspect_and_consolidate(step, true); });
}
