// DeepSpeed's batch rule, train_batch_size = micro batch x accumulation steps x data-parallel
// size, and its form under a pipeline: what a --deepspeed-config file's three batch keys and
// `dtorch train --global-batch-size` both resolve through.
#pragma once

#include <cstdint>
#include <optional>

namespace dtorch::train {
inline namespace config {

struct TrainConfig;

/// DeepSpeed's batch rule (Note [DeepSpeed configuration] in deepspeed_config.h): the micro batch
/// and accumulation steps for a data-parallel size `dp` from whichever of the three the file and
/// the flags give. Throws ConfigError when none of train_batch_size and micro batch is given, when
/// they disagree, or when one comes out below 1.
struct BatchSizes {
  int64_t micro = 0;
  int64_t accum = 0;
};
/// What the three are called where they came from: DeepSpeed's keys, or dtorch's flags.
struct BatchNames {
  const char* total = "train_batch_size";
  const char* micro = "train_micro_batch_size_per_gpu";
  const char* accum = "gradient_accumulation_steps";
};
BatchSizes resolve_batch_sizes(std::optional<int64_t> train_batch_size,
                               std::optional<int64_t> micro, std::optional<int64_t> accum, int dp,
                               const BatchNames& names = {});

/// Sets `c`'s batch size and accumulation steps from `b` (no pipeline).
void set_batch_sizes(const BatchSizes& b, TrainConfig& c);

/// The same rule under a pipeline (Note [Micro-batches] in run_config.h): a rank's batch and
/// its micro-batch count (0: not known, resolve() derives it) from whichever of the total,
/// the rank's batch, the micro-batch count and the micro-batch size are given. ConfigError when
/// two disagree, naming both as `names` calls them, or when a division is not exact.
struct PipelineBatch {
  std::optional<int64_t> batch;
  int microbatches = 0;
};
struct PipelineBatchNames {
  const char* total = "train_batch_size";
  const char* batch = "--batch-size";
  const char* microbatches = "gradient_accumulation_steps";
  const char* micro_size = "train_micro_batch_size_per_gpu";
};
PipelineBatch resolve_pipeline_batch(std::optional<int64_t> total, std::optional<int64_t> batch,
                                     std::optional<int64_t> microbatches,
                                     std::optional<int64_t> micro_size, int dp,
                                     const PipelineBatchNames& names = {});
void set_pipeline_batch_sizes(const PipelineBatch& b, TrainConfig& c);

}  // namespace config
}  // namespace dtorch::train
