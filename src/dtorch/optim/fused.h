// The optimizers a step runs: AdamW, Adam and SGD with momentum as one multi-tensor kernel per
// group of tensors instead of a loop of small kernels per parameter (Note [Fused optimizers]).
// They are torch::optim's own classes with another step(): the same options, the same state,
// the same checkpoints.
#pragma once

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <utility>
#include <vector>

namespace dtorch::optim {

// Note [Fused optimizers]
// torch::optim (C++) steps parameter by parameter: for AdamW about ten small kernels each, so
// a GPT-2 small spends three times PyTorch's fused AdamW on the CPU (312 against 60 ms a
// step) and 9 of 62 ms a step on an H200. These classes step every parameter of a parameter
// group that shares a device, a dtype and a step count in one call:
// - LibTorch 2.4 and later: PyTorch's fused kernels (at::_fused_adamw_, _fused_adam_,
//   _fused_sgd_; CPU and CUDA), the ones torch.optim.AdamW(fused=True) calls, so the numbers
//   are PyTorch's bit for bit;
// - LibTorch 1.13 to 2.3: the _foreach_ ops, in the order of torch.optim's foreach=True path,
//   up to 64 MiB of parameters a call (their temporaries are made for a whole call at once).
// The state is torch::optim's (AdamWParamState, AdamParamState, SGDParamState: its step an
// integer, its tensors per parameter), so checkpoints written by either load in the other,
// ZeRO's flat shards step as any parameter, and state_dict code reads it unchanged. A step
// count lives on the host; the fused kernels read it from a tensor made per call, on the
// parameters' device, so the step never waits on the device.

// Note [Steps the device skips]
// Under fp16 the device decides whether a step is taken (Note [Loss scaling] in
// train/strategy/loss_scaler.h): step_unless() hands the flag to the step, and the fused kernels
// read it where they run, leaving parameters and moments untouched when it is set. The host, which
// advanced its step counts and made first momentum buffers without knowing, learns the outcome
// a step later and calls undo_skipped_step(), which takes back exactly what the skipped step
// recorded, before the next step reads any of it. The _foreach_ path cannot read a flag on the
// device: it reads it on the host first (a sync on a GPU, nothing on the CPU) and skips
// entirely, recording nothing to undo.

/// What each of the optimizers below keeps for a step the device may skip.
class SkippableStep {
 public:
  virtual ~SkippableStep() = default;
  /// The next step() is skipped where `found_inf` (one float32 on the parameters' device) is
  /// nonzero; an undefined flag steps always.
  void skip_where(at::Tensor found_inf) { found_inf_ = std::move(found_inf); }
  /// Takes back what the last step recorded on the host (Note [Steps the device skips]).
  virtual void undo_skipped_step() = 0;

 protected:
  at::Tensor found_inf_;  // for the next step() only
};

/// AdamW (decoupled weight decay) stepped by multi-tensor kernels.
class FusedAdamW : public torch::optim::AdamW, public SkippableStep {
 public:
  using torch::optim::AdamW::AdamW;
  torch::Tensor step(LossClosure closure = nullptr) override;
  void undo_skipped_step() override;

 private:
  std::vector<torch::optim::AdamWParamState*> stepped_;  // by the last step()
};

/// Adam (weight decay as L2 on the gradient) stepped by multi-tensor kernels.
class FusedAdam : public torch::optim::Adam, public SkippableStep {
 public:
  using torch::optim::Adam::Adam;
  torch::Tensor step(LossClosure closure = nullptr) override;
  void undo_skipped_step() override;

 private:
  std::vector<torch::optim::AdamParamState*> stepped_;  // by the last step()
};

/// SGD (momentum, dampening, Nesterov, weight decay as L2) stepped by multi-tensor kernels.
class FusedSGD : public torch::optim::SGD, public SkippableStep {
 public:
  using torch::optim::SGD::SGD;
  torch::Tensor step(LossClosure closure = nullptr) override;
  void undo_skipped_step() override;

 private:
  std::vector<torch::optim::SGDParamState*> first_;  // momentum buffers the last step() made
};

/// Steps `opt` unless `found_inf` is set (Note [Steps the device skips]); any other optimizer
/// reads the flag on the host.
void step_unless(torch::optim::Optimizer& opt, const at::Tensor& found_inf);
/// After a step the device skipped: takes back what it recorded on the host.
void undo_skipped_step(torch::optim::Optimizer& opt);

// Note [Steps a part at a time]
// ZeRO's offloaded steps (Note [Optimizer state on disk], Note [State on the host]) step an
// optimizer over a part of its parameters at a time, the others' gradients hidden from it:
// torch::optim's classes and these step only parameters with a gradient, and their updates are
// elementwise, so the parts end where one step over all would. A skipped step is decided on the
// host before any part steps and taken over no gradients at all, so it records nothing for
// undo_skipped_step to take back (each part's step would record only its own).

/// While it lives, `params` have no gradients; each gets its own back when it goes.
class HiddenGradients {
 public:
  explicit HiddenGradients(std::vector<at::Tensor> params);
  ~HiddenGradients();
  HiddenGradients(const HiddenGradients&) = delete;
  HiddenGradients& operator=(const HiddenGradients&) = delete;
  /// The gradients taken away, in the order of `params`.
  const std::vector<at::Tensor>& grads() const { return grads_; }

 private:
  std::vector<at::Tensor> params_, grads_;
};

/// With every gradient of `opt` hidden (HiddenGradients): when `found_inf` is set (read on the
/// host, a wait on a GPU), takes the skipped step over no gradients and returns true (Note
/// [Steps a part at a time]).
bool skipped_over_nothing(torch::optim::Optimizer& opt, const at::Tensor& found_inf);

/// What this LibTorch steps them with: "fused" (PyTorch's fused kernels) or "foreach".
const char* fused_kernels();

}  // namespace dtorch::optim
