// The DDP reducer: executes a BucketPlan. As backward produces gradients they are copied
// into flat bucket buffers, which hold the parameters' .grad from then on (Note [Gradient
// views]), and each full bucket's allreduce starts at once; the end of
// backward waits for them. The step itself (hooks, pending counts, in-order launch, the end
// of backward) is the shared engine's (Note [Gradient readiness] in parallel/grad_ready.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dtorch/comm/communicator.h"
#include "dtorch/parallel/ddp/bucket_plan.h"
#include "dtorch/parallel/ddp/ddp.h"
#include "dtorch/parallel/grad_ready.h"

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
  void set_sync(bool sync) { ready_.set_sync(sync); }
  bool sync() const { return ready_.sync(); }
  const BucketPlan& plan() const { return plan_; }
  double comm_wait_seconds() const { return comm_wait_seconds_; }

  /// Outside backward: reduces the gradients accumulated under no_sync as one synchronised
  /// backward would (a parameter without a gradient counts as zeros). Collective.
  void reduce_accumulated() { ready_.reduce_accumulated(); }

 private:
  struct BucketState {
    at::Tensor flat;                // the bucket's gradients, contiguous
    std::vector<at::Tensor> views;  // per parameter, shaped like it, aliasing `flat`
    at::Tensor wire;                // compressed copy sent over the network, if any
    comm::Work work;
  };

  void absorb(size_t index);
  void launch(size_t b);
  void wait(size_t launched);
  void complete();

  std::vector<at::Tensor> params_;
  std::vector<at::Tensor> buffers_;
  std::shared_ptr<comm::Communicator> comm_;
  Options opts_;
  BucketPlan plan_;
  std::vector<BucketState> buckets_;
  double comm_wait_seconds_ = 0;
  // Last: its hooks call into the members above, so it goes first on destruction.
  parallel::GradReadiness ready_;
};

}  // namespace dtorch::ddp
