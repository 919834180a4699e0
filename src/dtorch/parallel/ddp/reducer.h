// The DDP reducer: executes a BucketPlan. Gradient-ready hooks fill flat bucket buffers and
// start each bucket's allreduce as soon as it is full; the end of backward waits for them.
// Lifecycle per step: prepare (first hook) -> on_grad_ready (each parameter) -> finalize.
#pragma once

#include <torch/csrc/autograd/function.h>

#include <memory>
#include <string>
#include <vector>

#include "dtorch/comm/communicator.h"
#include "dtorch/core/torch_compat.h"
#include "dtorch/parallel/ddp/bucket_plan.h"
#include "dtorch/parallel/ddp/ddp.h"

namespace dtorch::ddp {

class Reducer {
 public:
  /// `params` and `names` in registration order (only parameters that require grad);
  /// `buffers` are broadcast from rank 0 after each synchronised backward if asked.
  Reducer(std::vector<at::Tensor> params, std::vector<std::string> names,
          std::vector<at::Tensor> buffers, std::shared_ptr<comm::Communicator> comm,
          const Options& opts);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  /// Off: backward accumulates locally and communicates nothing (no_sync).
  void set_sync(bool sync) { sync_ = sync; }
  bool sync() const { return sync_; }
  const BucketPlan& plan() const { return plan_; }
  double comm_wait_seconds() const { return comm_wait_seconds_; }

  /// Called by the hook on a parameter's gradient accumulator, after accumulation.
  void on_grad_ready(size_t index);
  /// Outside backward: reduces the gradients accumulated under no_sync as one synchronised
  /// backward would (a parameter without a gradient counts as zeros). Collective.
  void reduce_accumulated();

 private:
  struct BucketState {
    at::Tensor flat;                // the bucket's gradients, contiguous
    std::vector<at::Tensor> views;  // per parameter, shaped like it, aliasing `flat`
    at::Tensor wire;                // compressed copy sent over the network, if any
    size_t pending = 0;             // parameters whose gradient has not arrived this step
    comm::Work work;
  };

  void prepare_for_backward();
  void reset_buckets();
  void launch_ready_buckets();
  void launch(size_t b);
  void finalize();
  void fail_unready();

  std::vector<at::Tensor> params_;
  std::vector<std::string> names_;
  std::vector<at::Tensor> buffers_;
  std::shared_ptr<comm::Communicator> comm_;
  Options opts_;
  BucketPlan plan_;
  std::vector<BucketState> buckets_;
  std::vector<compat::GradAccumulator> accumulators_;  // params hold them weakly
  std::vector<uintptr_t> hook_keys_;
  std::vector<bool> ready_;
  size_t next_bucket_ = 0;  // buckets launch strictly in order (Note [Bucket order])
  bool in_backward_ = false;
  bool sync_ = true;
  double comm_wait_seconds_ = 0;
};

}  // namespace dtorch::ddp
