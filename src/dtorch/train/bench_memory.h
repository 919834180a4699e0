// One layout's training steps measured on this rank, what `dtorch bench memory` prints and
// `dtorch plan --validate` compares its predictions with: model-state bytes against the ZeRO
// formulas, peak memory, bytes sent, the step's time and where it went.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>

#include "dtorch/train/config/run_config.h"

namespace dtorch::comm {
class Communicator;
}

namespace dtorch::train {

/// What to measure: a model under a strategy and a layout, on random batches made once in the
/// rank's device memory (what is timed is the step, not the making or copying of data).
struct BenchMemoryConfig {
  std::string model = "gpt-debug";
  StrategyConfig strategy;
  /// tp, pp (dp = world / (tp pp)), cp and recomputation, as `dtorch train` takes them
  ParallelismConfig parallelism;
  int64_t batch_size = 2;  ///< per rank
  int64_t seq_len = 64;    ///< tokens per sequence, capped at the model's block size
  int warmup_steps = 1;    ///< untimed steps before the timed ones
  int steps = 3;           ///< timed steps
  int64_t image_size = 0;  ///< image models: side of the square input (0: 28)
  int64_t classes = 0;     ///< image models: classes (0: 10)
  std::string profile;     ///< steps to trace, FIRST:LAST over all steps run (report/profiler.h)
  std::string out = ".";   ///< where `profile` writes trace.rank<N>.json
};

/// Assembles `c`'s layout over `world` (train::parallelize), runs its steps on this rank and
/// returns what it measured as one JSON object, the line `dtorch bench memory` prints for the
/// rank: the model-state bytes and the formula's, the peak RSS and
/// the GPU's peaks, the bytes sent per step by group, the timed steps' seconds and their
/// median, page faults per step; without a pipeline where a step's time went and the bytes
/// forward kept, under one the measured and simulated bubble; under --cp the attention bytes
/// sent against their count.
nlohmann::json bench_memory(const BenchMemoryConfig& c,
                            const std::shared_ptr<comm::Communicator>& world);

}  // namespace dtorch::train
