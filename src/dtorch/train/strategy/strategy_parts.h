// What the DDP and ZeRO strategies (ddp_strategy.cpp, zero_strategy.cpp) share: the optimizer
// they build, the compute precision, loss scaling over the groups a step spans, and their
// factories, which make_strategy chooses between. Internal to train/.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtorch/core/device.h"
#include "dtorch/train/strategy/loss_scaler.h"
#include "dtorch/train/strategy/strategy.h"

namespace dtorch::train {
inline namespace strategy {

/// The optimizer `c` names over `params`, at c.lr with its weight decay, stepped by
/// multi-tensor kernels (Note [Fused optimizers] in optim/fused.h).
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerConfig& c,
                                                        std::vector<torch::Tensor> params);
/// Sets every parameter group's learning rate.
void set_lr_of(torch::optim::Optimizer& opt, double lr);
/// The dtype forward computes in under `c`.
at::ScalarType compute_dtype(const PrecisionConfig& c);
/// The autocast a step runs forward under on `device` (off for fp32).
parallel::AutocastMode autocast_of(const PrecisionConfig& c, at::Device device);
/// The device of a model's parameters (the CPU for a model without any).
at::Device device_of(const torch::nn::Module& model);
/// The groups a strategy's step spans: its dp group, and the tp and pp groups beside it.
std::vector<comm::Communicator*> step_groups(comm::Communicator& dp,
                                             const std::shared_ptr<tp::TensorParallel>& tp,
                                             const std::shared_ptr<pp::Pipeline>& pipeline);
/// The gradients an optimizer step reads (undefined ones left out).
std::vector<at::Tensor> gradients_of(const torch::nn::Module& model);

// Note [Loss scaling] (train/strategy/loss_scaler.h): under --precision fp16 backward runs on the
// loss times the scale, and before each optimizer step every rank checks its gradients (whole, or
// its shards) for inf and nan; the flag is reduced with MAX over each group the strategy spans
// (dp, then tp, then pp: every rank of the job), so an overflow anywhere skips the step
// everywhere. The gradients are divided by the scale that produced them, then clipped, and
// the optimizer steps unless the flag is set; all of it on the device ("On the device"), the
// host following a step later (settle). The scaler's state rides in each checkpoint's
// metadata ("loss_scaler"), so a resumed run goes on with its scale.
class LossScaling {
 public:
  LossScaling(const PrecisionConfig& c, std::vector<comm::Communicator*> groups, at::Device device);
  /// The scale and the steps skipped so far (the host's copy, settled first).
  double scale() const;
  int64_t skipped() const;
  /// `loss` times the scale on the device.
  torch::Tensor scaled(const torch::Tensor& loss) const {
    return scaler_ ? loss * state_[0].to(loss.scalar_type()) : loss;
  }
  /// The optimizer whose host bookkeeping a skipped step takes back (Note [Steps the device
  /// skips] in optim/fused.h).
  void set_optimizer(torch::optim::Optimizer* opt) { optimizer_ = opt; }
  /// Before the optimizer step: checks `grads` for inf and nan over every group, unscales them
  /// and advances the scale, on the device. Returns the flag the optimizer takes (step_unless),
  /// undefined without fp16. Collective over every group.
  at::Tensor check_and_unscale(std::vector<at::Tensor> grads);
  /// Brings the host's copy up to date with the last step the device decided (waiting for it
  /// if needed), and takes back the optimizer's bookkeeping of a skipped step. Throws
  /// dtorch::Error when that step overflowed at the floor.
  void settle() const;
  /// `metadata_json` with the scaler's state added (unchanged without a scaler).
  std::string with_state(const std::string& metadata_json) const;
  /// Takes the state a checkpoint's metadata holds, when both have one.
  void restore(const PrecisionConfig& c, const std::string& metadata_json);

 private:
  std::vector<comm::Communicator*> groups_;
  // The host's copy, a step behind the device's state_ until settle().
  mutable std::optional<LossScaler> scaler_;
  at::Tensor state_;            // LossScaler::state_tensor() on the device
  mutable LateRead last_step_;  // the last step's flag and state after it
  torch::optim::Optimizer* optimizer_ = nullptr;
};

/// DDP (ddp_strategy.cpp) and ZeRO-1/2/3 (zero_strategy.cpp) over `comm`.
std::unique_ptr<Strategy> make_ddp_strategy(const StrategyConfig& c,
                                            std::shared_ptr<models::Model> model,
                                            std::shared_ptr<comm::Communicator> comm,
                                            TensorParallelism tp, PipelineParallelism pp);
std::unique_ptr<Strategy> make_zero_strategy(const StrategyConfig& c,
                                             std::shared_ptr<models::Model> model,
                                             std::shared_ptr<comm::Communicator> comm,
                                             TensorParallelism tp, PipelineParallelism pp,
                                             HybridSharding hybrid);

}  // namespace strategy
}  // namespace dtorch::train
