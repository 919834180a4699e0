// parallelize(): how a run's model is spread over the job, in one place and one order (Note
// [Assembly order]): the mesh, this rank's pipeline stages, their tensor-parallel split, the
// device, activation checkpointing, then the data-parallel strategy. `dtorch train`, `dtorch
// bench memory` and C++ programs assemble a run through it.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "dtorch/comm/communicator.h"
#include "dtorch/models/model.h"
#include "dtorch/train/config/parallelism_config.h"
#include "dtorch/train/strategy/strategy.h"

namespace dtorch::train {

// Note [Assembly order]
// parallelize() applies the parallelisms in one fixed order, each to what the previous made:
//  1. the mesh: dp x cp x tp x pp groups over the job (parallel/parallel_dims.h, Note [Mesh
//     layout]), split once; with tp = cp = pp = 1 the job's communicator is the dp group
//     itself;
//  2. the model: under a pipeline each rank builds its own stages only (the whole model is
//     never allocated; Note [Unit seeds] gives them the whole model's weights); without one,
//     the whole model, without memory where ZeRO-3 or tensor parallelism will fill it in
//     (Note [Deferred initialisation]); in host memory, from the same generator on every rank;
//  3. tensor (and sequence) parallelism splits it across the tp group, then context
//     parallelism makes its attention span the cp group (it moves no parameter);
//  4. the split model moves to the rank's device (models::to_device);
//  5. activation checkpointing wraps every K-th block of what the rank holds;
//  6. the strategy (DDP or ZeRO-1/2/3) over the dp group (dp x cp under context parallelism:
//     every rank holding the same parameters), with the tensor and pipeline parallelism it
//     must know of (clip norms span them, checkpoints name them).
// Each step needs the one before: stages are cut before they are split, the split happens in
// host memory so no GPU ever holds a whole layer, recomputation wraps the blocks the rank
// runs, and the strategy shards or buckets the parameters as they finally are.

/// What parallelize() builds and applies.
struct ParallelizeSpec {
  std::string model;              ///< a models::model_names() entry
  models::ImageInput input;       ///< what an image model is built for
  ParallelismConfig parallelism;  ///< the mesh, the stages, the tp split, recomputation
  StrategyConfig strategy;        ///< over the dp group (its model and input are set from above)
  at::Device device = at::kCPU;   ///< the rank's device (resolve_run_device)
};

/// A model spread over the job: the mesh's groups with the tensor and pipeline parallelism,
/// this rank's model (its stages under a pipeline), and the strategy over the dp group.
struct Parallelized {
  Layout layout;
  std::shared_ptr<models::Model> model;
  std::unique_ptr<Strategy> strategy;
};

/// Note [Assembly order]. `before_strategy`, when given, sees the rank's model once it is
/// split and on its device (the trainer counts it for an out-of-memory report). ConfigError for
/// layouts that do not fit the job or the model. Collective over `world`.
Parallelized parallelize(const ParallelizeSpec& spec,
                         const std::shared_ptr<comm::Communicator>& world,
                         const std::function<void(const models::Model&)>& before_strategy = {});

}  // namespace dtorch::train
