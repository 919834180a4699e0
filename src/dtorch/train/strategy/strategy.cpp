// The trainer's strategies (see strategy.h): the names of their closed sets, their validation,
// the device a rank trains on, and what DDP (ddp_strategy.cpp) and the ZeRO stages
// (zero_strategy.cpp) share (strategy_parts.h).
#include "dtorch/train/strategy/strategy.h"

#include <nlohmann/json.hpp>

#include <tuple>

#include "dtorch/core/device.h"
#include "dtorch/core/error.h"
#include "dtorch/core/torch_compat.h"
#include "dtorch/optim/fused.h"
#include "dtorch/train/strategy/loss_scaler.h"
#include "dtorch/train/strategy/strategy_parts.h"

namespace dtorch::train {
inline namespace strategy {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerConfig& c,
                                                        std::vector<torch::Tensor> params) {
  const double decay = weight_decay_of(c);
  if (c.kind == OptimizerKind::SGD) {
    return std::make_unique<optim::FusedSGD>(
        params, torch::optim::SGDOptions(c.lr).momentum(c.momentum).weight_decay(decay));
  }
  const std::tuple<double, double> betas{c.betas.at(0), c.betas.at(1)};
  if (c.kind == OptimizerKind::Adam) {
    return std::make_unique<optim::FusedAdam>(
        params, torch::optim::AdamOptions(c.lr).betas(betas).eps(c.eps).weight_decay(decay));
  }
  return std::make_unique<optim::FusedAdamW>(
      params, torch::optim::AdamWOptions(c.lr).betas(betas).eps(c.eps).weight_decay(decay));
}

void set_lr_of(torch::optim::Optimizer& opt, double lr) {
  for (auto& group : opt.param_groups())
    group.options().set_lr(lr);
}

at::ScalarType compute_dtype(const PrecisionConfig& c) {
  switch (c.compute) {
    case Precision::BF16:
      return at::kBFloat16;
    case Precision::FP16:
      return at::kHalf;
    case Precision::FP32:
      break;
  }
  return at::kFloat;
}

parallel::AutocastMode autocast_of(const PrecisionConfig& c, at::Device device) {
  return {c.compute != Precision::FP32, device.type(), compute_dtype(c)};
}

at::Device device_of(const torch::nn::Module& model) {
  for (const auto& p : model.parameters())
    return p.device();
  return at::kCPU;
}

std::vector<comm::Communicator*> step_groups(comm::Communicator& dp,
                                             const std::shared_ptr<tp::TensorParallel>& tp,
                                             const std::shared_ptr<pp::Pipeline>& pipeline) {
  return {&dp, tp ? tp->group().get() : nullptr, pipeline ? &pipeline->group() : nullptr};
}

std::vector<at::Tensor> gradients_of(const torch::nn::Module& model) {
  std::vector<at::Tensor> out;
  for (const auto& p : model.parameters())
    if (p.grad().defined()) out.push_back(p.grad());
  return out;
}

LossScaling::LossScaling(const PrecisionConfig& c, std::vector<comm::Communicator*> groups,
                         at::Device device)
    : groups_(std::move(groups)) {
  if (c.compute != Precision::FP16) return;
  scaler_.emplace(c.loss_scale);
  state_ = scaler_->state_tensor(device);
}

double LossScaling::scale() const {
  settle();
  return scaler_ ? scaler_->scale() : 1.0;
}

int64_t LossScaling::skipped() const {
  settle();
  return scaler_ ? scaler_->skipped() : 0;
}

at::Tensor LossScaling::check_and_unscale(std::vector<at::Tensor> grads) {
  if (!scaler_) return {};
  settle();
  torch::NoGradGuard no_grad;
  at::Tensor flag = non_finite_flag(grads, state_.device());
  for (comm::Communicator* g : groups_)
    if (g) g->allreduce(flag, comm::ReduceOp::Max, "fp16 overflow check");
  unscale(grads, state_[0].reciprocal());  // by the scale backward used, before it changes
  update_on_device(scaler_->config(), state_, flag);
  last_step_.start(at::cat({flag.to(at::kDouble), state_}));
  return flag;
}

void LossScaling::settle() const {
  if (!last_step_.pending()) return;
  const at::Tensor read = last_step_.take();
  const bool overflow = read[0].item<double>() != 0;
  scaler_->update(overflow);  // the error at the floor comes from here
  const at::Tensor device_state = read.narrow(0, 1, 5);
  DTORCH_CHECK(scaler_->same_state(device_state),
               "fp16 loss scaling: the device's scaler state (scale, iteration, last overflow, "
               "hysteresis, skipped) ",
               c10::ArrayRef<double>(device_state.data_ptr<double>(), 5),
               " differs from the host's ", scaler_->to_json().dump());
  if (overflow && optimizer_) optim::undo_skipped_step(*optimizer_);
}

std::string LossScaling::with_state(const std::string& metadata_json) const {
  if (!scaler_) return metadata_json;
  settle();
  auto j = nlohmann::json::parse(metadata_json);
  j["loss_scaler"] = scaler_->to_json();
  return j.dump();
}

void LossScaling::restore(const PrecisionConfig& c, const std::string& metadata_json) {
  if (!scaler_) return;
  settle();
  auto j = nlohmann::json::parse(metadata_json, nullptr, false);
  if (!j.is_object() || !j.contains("loss_scaler")) return;
  scaler_ = LossScaler::from_json(c.loss_scale, j.at("loss_scaler"));
  state_.copy_(scaler_->state_tensor(state_.device()));
}

at::Device resolve_run_device(DeviceKind spec, const launch::RankInfo& job) {
  const bool share = comm::comm_options_from_env().backend == "gloo";
  const at::Device d =
      resolve_device(spec, job.local_rank, job.local_world_size, cuda_availability(), share);
  use_device(d);
  return d;
}

torch::Tensor Layout::local_tokens(const torch::Tensor& x) const {
  return cp ? cp->shard(x) : x;
}

std::unique_ptr<Strategy> make_strategy(const StrategyConfig& c,
                                        std::shared_ptr<models::Model> model,
                                        std::shared_ptr<comm::Communicator> comm,
                                        TensorParallelism tp, PipelineParallelism pp,
                                        HybridSharding hybrid) {
  validate(c);
  DTORCH_CHECK_T(
      ConfigError,
      c.precision.compute != Precision::FP16 || device_of(*model).is_cuda() || compat::kTorch2,
      "--precision fp16 on the CPU needs LibTorch 2.x's CPU autocast (this is ", TORCH_VERSION,
      ", whose CPU autocast has bfloat16 only): use --precision bf16, or "
      "--device cuda");
  if (c.kind == StrategyKind::DDP) {
    if (hybrid.replicate) check_replicas_need_zero(c.kind, str(hybrid.replicate->size()));
    return make_ddp_strategy(c, std::move(model), std::move(comm), std::move(tp), std::move(pp));
  }
  return make_zero_strategy(c, std::move(model), std::move(comm), std::move(tp), std::move(pp),
                            std::move(hybrid));
}

}  // namespace strategy
}  // namespace dtorch::train
