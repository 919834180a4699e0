// What the two .dtc harnesses do with a checkpoint file: read it as `dtorch checkpoint
// consolidate` does, then restore it into gpt-debug and its SGD as a resumed run does (the
// seeds are gpt-debug's checkpoints, so well-formed inputs get through to the optimizer state).
#pragma once

#include <memory>
#include <string>

#include "dtorch/checkpoint/checkpoint.h"
#include "dtorch/models/registry.h"
#include "dtorch/train/strategy/strategy_parts.h"

namespace dtorch::fuzz {

inline void read_and_restore_checkpoint(const std::string& path) {
  static const std::shared_ptr<models::Model> model = models::make_model("gpt-debug");
  static const std::unique_ptr<torch::optim::Optimizer> optimizer =
      train::make_optimizer(train::OptimizerConfig{}, model->parameters());
  auto [state, data] = checkpoint::read_checkpoint_model(path);
  (void)state;
  (void)data;
  checkpoint::load_checkpoint(path, *model, optimizer.get());
}

}  // namespace dtorch::fuzz
