// A run's config.json (`dtorch train --config FILE`, the file every run writes into --out): the
// input is the file, read by read_config_file, resolved as `dtorch train` does before it
// launches (a job of 4 ranks), and written back as --print-config prints it.
#include <cstdint>
#include <set>
#include <string>

#include "dtorch/train/run_config.h"
#include "fuzz_support.h"

DTORCH_FUZZ_TARGET(run_config) {
  using namespace dtorch;
  static const std::string path = paths::join(fuzz::scratch(), "config.json");
  fuzz::write_file(path, data, size);
  return fuzz::accept_errors([&] {
    train::ConfigSources sources;
    train::TrainConfig c = train::read_config_file(path, &sources.given);
    sources.world_size = 4;
    (void)train::resolve(c, sources);
    (void)train::to_json(c).dump();
  });
}
