// DeepSpeed configuration files (`dtorch train --deepspeed-config ds_config.json`, Note
// [DeepSpeed configuration]): the input is the file, read, applied and validated by resolve()
// as `dtorch train` does before it launches, for a job of 4 ranks.
#include <cstdint>

#include "dtorch/train/config/run_config.h"
#include "fuzz_support.h"

DTORCH_FUZZ_TARGET(deepspeed_config) {
  using namespace dtorch;
  static const std::string path = paths::join(fuzz::scratch(), "ds_config.json");
  fuzz::write_file(path, data, size);
  return fuzz::accept_errors([&] {
    train::TrainConfig c;
    train::ConfigSources sources;
    sources.deepspeed_config = path;
    sources.world_size = 4;
    (void)train::resolve(c, sources);
    (void)train::to_json(c).dump();
  });
}
