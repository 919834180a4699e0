// A run's config.json (`dtorch train --config FILE`, the file every run writes into --out): the
// input is the file, read by read_config_file, resolved as `dtorch train` does before it
// launches (a job of 4 ranks, so a file of another job's size changes the batch), and written
// back as --print-config prints it.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <set>
#include <string>

#include "dtorch/train/config/run_config.h"
#include "fuzz_support.h"

DTORCH_FUZZ_TARGET(run_config) {
  using namespace dtorch;
  static const std::string path = paths::join(fuzz::scratch(), "config.json");
  fuzz::write_file(path, data, size);
  return fuzz::accept_errors([&] {
    train::ConfigSources sources;
    train::TrainConfig c = train::read_config_file(path, &sources.given, &sources.config_file_job);
    const train::TrainConfig file = c;
    sources.config_file = &file;
    sources.config_file_name = path;
    sources.world_size = 4;
    (void)train::resolve(c, sources);
    (void)train::config_file_json(c, {1, 4, 4}).dump();
  });
}
