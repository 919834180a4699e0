// dtorch's public API in one include, for programs that link dtorch::dtorch.
// The pieces: the communicator and its process groups, DDP, ZeRO and tensor parallelism, the
// launcher's rank description, data, models (dtorch's own, and yours through wrap_module) and
// training helpers.
#pragma once

#include "dtorch/checkpoint/checkpoint.h"
#include "dtorch/checkpoint/sharded_checkpoint.h"
#include "dtorch/checkpoint/state_dict.h"
#include "dtorch/comm/communicator.h"
#include "dtorch/core/error.h"
#include "dtorch/core/log.h"
#include "dtorch/data/mnist_dataset.h"
#include "dtorch/data/sampler.h"
#include "dtorch/data/text_dataset.h"
#include "dtorch/launch/rank_info.h"
#include "dtorch/models/module_hooks.h"
#include "dtorch/models/registry.h"
#include "dtorch/models/wrapped_module.h"
#include "dtorch/parallel/activation_checkpoint.h"
#include "dtorch/parallel/autocast.h"
#include "dtorch/parallel/ddp/ddp.h"
#include "dtorch/parallel/parallel_dims.h"
#include "dtorch/parallel/pp/pipeline.h"
#include "dtorch/parallel/pp/stage_plan.h"
#include "dtorch/parallel/tp/tensor_parallel.h"
#include "dtorch/parallel/zero/zero.h"
#include "dtorch/train/loss.h"
#include "dtorch/train/parallelize.h"
#include "dtorch/train/step.h"
#include "dtorch/train/strategy/zero_grad.h"
