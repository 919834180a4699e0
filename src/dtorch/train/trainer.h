// The training loop behind `dtorch train`: a registered model on an image dataset or a text,
// spread over the communicator's ranks by a strategy (DDP or ZeRO-1/2/3), with progress,
// per-epoch evaluation, metrics, checkpoints and resume. Rank 0 reports; every rank trains.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dtorch/comm/communicator.h"
#include "dtorch/report/metrics.h"
#include "dtorch/report/progress.h"
#include "dtorch/train/config/lr_schedule.h"
#include "dtorch/train/config/run_config.h"
#include "dtorch/train/strategy/strategy.h"
#include "dtorch/train/train_data.h"

namespace dtorch::train {

/// Trains and returns the record of every epoch run (all ranks get the same records). `c` is
/// resolved for the communicator's size first (resolve() without other sources: the defaults
/// that depend on other settings), and rank 0 writes it to <out>/config.json before training.
std::vector<report::EpochRecord> train(const TrainConfig& c,
                                       std::shared_ptr<comm::Communicator> comm);

}  // namespace dtorch::train
