// Distributed data parallel, applied to any torch::nn::Module by a function:
//   auto ddp = dtorch::ddp::wrap(model, comm);   // broadcast from rank 0, check shapes
//   loss.backward();                              // gradients averaged across ranks
// Gradients are reduced in buckets whose allreduce starts from the gradient-ready hooks while
// backward is still running, and is waited for at the end of backward.
// See Note [Bucket order] in bucket_plan.h and Note [Gradient views] in reducer.cpp.
#pragma once

#include <torch/nn/module.h>

#include <memory>

#include "dtorch/comm/communicator.h"
#include "dtorch/core/enum_names.h"
#include "dtorch/parallel/ddp/bucket_plan.h"
#include "dtorch/parallel/ddp/options.h"

namespace dtorch::ddp {

class Reducer;

/// The handle ddp::wrap returns; keep it alive as long as the model trains.
class DistributedDataParallel {
 public:
  /// RAII guard: while it lives, backward accumulates gradients locally without
  /// communicating (gradient accumulation: K-1 micro-steps under no_sync, then one synced).
  class NoSync {
   public:
    explicit NoSync(Reducer* r);
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;
    NoSync(NoSync&& o) noexcept : r_(o.r_) { o.r_ = nullptr; }

   private:
    Reducer* r_;
  };

  DistributedDataParallel(std::shared_ptr<torch::nn::Module> model,
                          std::shared_ptr<comm::Communicator> comm, Options opts);
  ~DistributedDataParallel();

  [[nodiscard]] NoSync no_sync();
  /// After backward passes under no_sync(): averages the accumulated gradients across ranks
  /// now, as a synchronised backward would have (for callers that run autograd themselves
  /// many times a step, such as a pipeline schedule). Collective.
  void reduce_accumulated();
  const BucketPlan& plan() const;
  const Options& options() const { return opts_; }
  /// Seconds spent blocked waiting for gradient communication at the end of backward,
  /// summed since construction.
  double comm_wait_seconds() const;

 private:
  std::shared_ptr<torch::nn::Module> model_;
  std::shared_ptr<comm::Communicator> comm_;
  Options opts_;
  std::unique_ptr<Reducer> reducer_;
};

/// Makes `model` data-parallel over `comm`: broadcasts parameters and buffers from rank 0,
/// checks that every rank has the same parameter names and shapes (a mismatch is a
/// ConfigError naming the first differing parameter), and installs the gradient hooks.
std::shared_ptr<DistributedDataParallel> wrap(std::shared_ptr<torch::nn::Module> model,
                                              std::shared_ptr<comm::Communicator> comm,
                                              Options opts = {});

}  // namespace dtorch::ddp
