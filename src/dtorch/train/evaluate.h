// The evaluation pass of each epoch, under any layout.
#pragma once

#include <cstdint>
#include <utility>

#include "dtorch/comm/communicator.h"
#include "dtorch/models/model.h"
#include "dtorch/parallel/pp/pipeline.h"
#include "dtorch/parallel/tp/tensor_parallel.h"
#include "dtorch/train/strategy/strategy.h"
#include "dtorch/train/train_data.h"

namespace dtorch::train {

/// Sum of loss and correct predictions over this replica's disjoint part of the test split,
/// added up across the layout's dp ranks (tensor-parallel ranks share a part; context-parallel
/// ranks each count their tokens of it; under a pipeline only the last stage counts and the
/// totals are added up over `world`): every test sample (every target token) counts exactly
/// once.
std::pair<double, double> evaluate(models::Model& model, const Split& test, int64_t limit,
                                   Strategy& strategy, const Layout& layout,
                                   comm::Communicator& world);

}  // namespace dtorch::train
