// DeepSpeed's batch rule (batch_sizes.h).
#include "dtorch/train/config/batch_sizes.h"

#include <string>

#include "dtorch/core/error.h"
#include "dtorch/train/config/run_config.h"

namespace dtorch::train {
inline namespace config {

BatchSizes resolve_batch_sizes(std::optional<int64_t> train, std::optional<int64_t> micro,
                               std::optional<int64_t> accum, int dp, const BatchNames& n) {
  if (!train) {
    DTORCH_CHECK_T(ConfigError, micro.has_value(), "give ", n.total, " or ", n.micro,
                   " (or --batch-size)");
    return {*micro, accum.value_or(1)};
  }
  BatchSizes b;
  if (micro && accum) {
    b = {*micro, *accum};
  } else if (micro) {
    b = {*micro, *train / *micro / dp};
  } else if (accum) {
    b = {*train / dp / *accum, *accum};
  } else {
    b = {*train / dp, 1};
  }
  DTORCH_CHECK_T(ConfigError, b.micro >= 1 && b.accum >= 1, n.total, " ", *train,
                 " is too small for a data-parallel size of ", dp, " with ",
                 micro ? str(n.micro, " ", *micro) : str(n.accum, " ", accum.value_or(1)),
                 "; raise it to at least ", micro ? *micro * dp : dp * accum.value_or(1));
  DTORCH_CHECK_T(ConfigError, *train == b.micro * b.accum * dp, n.total, " ", *train, " is not ",
                 n.micro, " ", b.micro, " x ", n.accum, " ", b.accum, " x data-parallel size ", dp,
                 " (= ", b.micro * b.accum * dp, "), which DeepSpeed requires; change one of them",
                 dp > 1 ? str(", or make ", n.total, " a multiple of ", dp) : std::string(),
                 ", or leave ", n.total, " out to have it computed");
  return b;
}

void set_batch_sizes(const BatchSizes& b, TrainConfig& c) {
  c.training.batch_size = b.micro;
  c.training.accum_steps = static_cast<int>(b.accum);
}

PipelineBatch resolve_pipeline_batch(std::optional<int64_t> total, std::optional<int64_t> batch,
                                     std::optional<int64_t> microbatches,
                                     std::optional<int64_t> micro_size, int dp,
                                     const PipelineBatchNames& n) {
  PipelineBatch b;
  b.batch = batch;
  std::string batch_is = str(n.batch, " ", batch.value_or(0));  // the batch and its source
  // A rank's batch from another pair of sources must agree with the one given.
  auto agree = [&](int64_t v, const std::string& from) {
    DTORCH_CHECK_T(ConfigError, !b.batch || *b.batch == v, batch_is, " disagrees with ", from, " (",
                   v, " per rank); give one of them");
    if (!b.batch) batch_is = str("the batch per rank ", v, " (", from, ")");
    b.batch = v;
  };
  if (total) {
    DTORCH_CHECK_T(ConfigError, *total % dp == 0 && *total >= dp, n.total, " ", *total,
                   " is not a multiple of the ", dp, " data-parallel rank(s); make it one");
    agree(*total / dp, str(n.total, " ", *total, " over ", dp, " data-parallel rank(s)"));
  }
  if (micro_size && microbatches) {
    agree(*micro_size * *microbatches,
          str(n.micro_size, " ", *micro_size, " x ", n.microbatches, " ", *microbatches));
  }
  if (microbatches) {
    b.microbatches = static_cast<int>(*microbatches);
  } else if (micro_size && b.batch) {
    DTORCH_CHECK_T(ConfigError, *b.batch % *micro_size == 0, batch_is, " is not a multiple of ",
                   n.micro_size, " ", *micro_size, "; change one of them");
    b.microbatches = static_cast<int>(*b.batch / *micro_size);
  }
  if (b.batch && b.microbatches > 0) {
    DTORCH_CHECK_T(ConfigError, *b.batch % b.microbatches == 0, batch_is, " cannot be cut into ",
                   n.microbatches, " ", b.microbatches,
                   " equal micro-batches; make it a multiple of ", b.microbatches);
  }
  return b;
}

void set_pipeline_batch_sizes(const PipelineBatch& b, TrainConfig& c) {
  if (b.batch) c.training.batch_size = *b.batch;
  if (b.microbatches > 0) c.parallelism.microbatches = b.microbatches;
  c.training.accum_steps = 1;
}

}  // namespace config
}  // namespace dtorch::train
