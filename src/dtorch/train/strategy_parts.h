// What the DDP and ZeRO strategies (ddp_strategy.cpp, zero_strategy.cpp) share: the optimizer
// they build, the compute precision, loss scaling over the groups a step spans, and their
// factories, which make_strategy chooses between. Internal to train/.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtorch/train/loss_scaler.h"
#include "dtorch/train/strategy.h"

namespace dtorch::train {

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

// Note [Loss scaling] (train/loss_scaler.h): under --precision fp16 backward runs on the loss
// times the scale, and before each optimizer step every rank checks its gradients (whole, or
// its shards) for inf and nan; the flag is reduced with MAX over each group the strategy spans
// (dp, then tp, then pp: every rank of the job), so an overflow anywhere skips the step
// everywhere. Otherwise the gradients are divided by the scale that produced them (before
// the scaler may raise it), then clipped and applied. The scaler's state rides in each
// checkpoint's metadata ("loss_scaler"), so a resumed run goes on with its scale.
class LossScaling {
 public:
  LossScaling(const PrecisionConfig& c, std::vector<comm::Communicator*> groups);
  double scale() const { return scaler_ ? scaler_->scale() : 1.0; }
  int64_t skipped() const { return scaler_ ? scaler_->skipped() : 0; }
  torch::Tensor scaled(const torch::Tensor& loss) const {
    return scaler_ ? loss * scaler_->scale() : loss;
  }
  /// Whether to take the optimizer step with `grads`, which it unscales when so. Collective
  /// over every group.
  bool ready(std::vector<at::Tensor> grads);
  /// `metadata_json` with the scaler's state added (unchanged without a scaler).
  std::string with_state(const std::string& metadata_json) const;
  /// Takes the state a checkpoint's metadata holds, when both have one.
  void restore(const PrecisionConfig& c, const std::string& metadata_json);

 private:
  std::vector<comm::Communicator*> groups_;
  std::optional<LossScaler> scaler_;
};

/// DDP (ddp_strategy.cpp) and ZeRO-1/2/3 (zero_strategy.cpp) over `comm`.
std::unique_ptr<Strategy> make_ddp_strategy(const StrategyConfig& c,
                                            std::shared_ptr<models::Model> model,
                                            std::shared_ptr<comm::Communicator> comm,
                                            TensorParallelism tp, PipelineParallelism pp);
std::unique_ptr<Strategy> make_zero_strategy(const StrategyConfig& c,
                                             std::shared_ptr<models::Model> model,
                                             std::shared_ptr<comm::Communicator> comm,
                                             TensorParallelism tp, PipelineParallelism pp);

}  // namespace dtorch::train
