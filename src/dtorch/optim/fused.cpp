// The multi-tensor steps of AdamW, Adam and SGD (Note [Fused optimizers] in fused.h).
#include "dtorch/optim/fused.h"

#include <ATen/ATen.h>
#include <torch/version.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "dtorch/core/torch_compat.h"

// PyTorch's fused CPU kernels arrived in 2.4 (CUDA's AdamW in 2.0, SGD in 2.2).
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define DTORCH_FUSED_KERNELS 1
#else
#define DTORCH_FUSED_KERNELS 0
#endif

namespace dtorch::optim {
namespace {

using TensorVec = std::vector<at::Tensor>;

// The parameters of one parameter group that one kernel call steps: same device, dtype and
// step count (SGD: whether their momentum buffers exist yet).
struct Batch {
  at::Device device;
  at::ScalarType dtype;
  int64_t step;
  TensorVec params, grads, first, second, max;  // Adam: exp_avg, exp_avg_sq, max_exp_avg_sq
  int64_t bytes = 0;                            // the parameters'
};

// The _foreach_ path makes temporaries for a whole call at once (AdamW's denominators, SGD's
// decayed gradients), where the per-parameter loop made one parameter's at a time: a call
// takes parameters up to this size, so that the step holds at most about that much more.
// The fused kernels make none.
constexpr int64_t kBatchBytes = DTORCH_FUSED_KERNELS ? INT64_MAX : int64_t{64} << 20;

Batch& batch_for(std::vector<Batch>& batches, const at::Tensor& p, int64_t step) {
  const int64_t bytes = static_cast<int64_t>(p.nbytes());
  for (Batch& b : batches) {
    if (b.device == p.device() && b.dtype == p.scalar_type() && b.step == step &&
        (b.params.empty() || b.bytes + bytes <= kBatchBytes)) {
      b.bytes += bytes;
      return b;
    }
  }
  batches.push_back({p.device(), p.scalar_type(), step, {}, {}, {}, {}, {}, bytes});
  return batches.back();
}

const at::Tensor& gradient_of(const at::Tensor& p) {
  const at::Tensor& g = p.grad();
  TORCH_CHECK(!g.is_sparse(), "dtorch's fused optimizers take dense gradients only");
  return g;
}

// Runs the closure, if any, with gradients on (as torch::optim's step does).
torch::Tensor loss_of(const torch::optim::Optimizer::LossClosure& closure) {
  if (!closure) return {};
  at::AutoGradMode enable_grad(true);
  return closure();
}

struct AdamHyper {
  double lr, beta1, beta2, weight_decay, eps;
  bool amsgrad, decoupled;  // decoupled: AdamW's weight decay
};

#if DTORCH_FUSED_KERNELS
// The flag as the fused kernels take it (Note [Steps the device skips]).
c10::optional<at::Tensor> flag_of(const at::Tensor& found_inf) {
  return found_inf.defined() ? c10::optional<at::Tensor>(found_inf) : c10::nullopt;
}
#endif

// The flag read on the host (a sync on a GPU): for what cannot read it on the device.
bool set_on_host(const at::Tensor& found_inf) {
  return found_inf.defined() && found_inf.item<float>() != 0;
}

// Whether a step without fused kernels is skipped: the _foreach_ ops cannot read the flag on
// the device, so it is read here (Note [Steps the device skips]).
bool skipped_on_host(const at::Tensor& found_inf) {
  return !DTORCH_FUSED_KERNELS && set_on_host(found_inf);
}

#if DTORCH_FUSED_KERNELS
// The step count as the fused kernels read it: one float per parameter, on its device, made
// by one fill (no copy from the host, so nothing waits on the device).
TensorVec step_tensors(const Batch& b) {
  at::Tensor steps = at::full({static_cast<int64_t>(b.params.size())}, static_cast<double>(b.step),
                              at::TensorOptions().dtype(at::kFloat).device(b.device));
  return steps.unbind(0);
}

void adam_step(Batch& b, const AdamHyper& h, const at::Tensor& found_inf) {
  const TensorVec steps = step_tensors(b);
  if (h.decoupled) {
    at::_fused_adamw_(b.params, b.grads, b.first, b.second, b.max, steps, h.lr, h.beta1, h.beta2,
                      h.weight_decay, h.eps, h.amsgrad, /*maximize=*/false, c10::nullopt,
                      flag_of(found_inf));
  } else {
    at::_fused_adam_(b.params, b.grads, b.first, b.second, b.max, steps, h.lr, h.beta1, h.beta2,
                     h.weight_decay, h.eps, h.amsgrad, /*maximize=*/false, c10::nullopt,
                     flag_of(found_inf));
  }
}
#else
// torch.optim's _multi_tensor_adam(w), with the bias corrections from the host's step count.
// A flag was read on the host before (skipped_on_host).
void adam_step(Batch& b, const AdamHyper& h, const at::Tensor& /*found_inf*/) {
  TensorVec grads = b.grads;
  if (h.weight_decay != 0) {
    if (h.decoupled) {
      at::_foreach_mul_(b.params, 1 - h.lr * h.weight_decay);
    } else {
      grads = at::_foreach_add(b.grads, b.params, h.weight_decay);
    }
  }
  at::_foreach_mul_(b.first, h.beta1);
  at::_foreach_add_(b.first, grads, 1 - h.beta1);
  at::_foreach_mul_(b.second, h.beta2);
  at::_foreach_addcmul_(b.second, grads, grads, 1 - h.beta2);
  const double step = static_cast<double>(b.step);
  const double correction1 = 1 - std::pow(h.beta1, step);
  const double correction2 = 1 - std::pow(h.beta2, step);
  if (h.amsgrad) {
    for (size_t i = 0; i < b.max.size(); ++i)
      at::maximum_out(b.max[i], b.max[i], b.second[i]);
  }
  TensorVec denom = at::_foreach_sqrt(h.amsgrad ? b.max : b.second);
  at::_foreach_div_(denom, std::sqrt(correction2));
  at::_foreach_add_(denom, h.eps);
  at::_foreach_addcdiv_(b.params, b.first, denom, -h.lr / correction1);
}
#endif

// Adam and AdamW: their states and options differ in type only. `stepped` gets the states
// whose step count advanced.
template <typename State, typename Options>
void step_adam(torch::optim::Optimizer& opt, bool decoupled, const at::Tensor& found_inf,
               std::vector<State*>& stepped) {
  stepped.clear();
  if (skipped_on_host(found_inf)) return;
  for (auto& group : opt.param_groups()) {
    const auto& o = static_cast<const Options&>(group.options());
    std::vector<Batch> batches;
    for (const auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      const at::Tensor& g = gradient_of(p);
      auto& slot = opt.state()[compat::optimizer_state_key(p)];
      if (!slot) {
        auto s = std::make_unique<State>();
        s->step(0);
        s->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
        s->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
        if (o.amsgrad()) s->max_exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
        slot = std::move(s);
      }
      auto& s = static_cast<State&>(*slot);
      s.step(s.step() + 1);
      stepped.push_back(&s);
      Batch& b = batch_for(batches, p, s.step());
      b.params.push_back(p);
      b.grads.push_back(g);
      b.first.push_back(s.exp_avg());
      b.second.push_back(s.exp_avg_sq());
      if (o.amsgrad()) b.max.push_back(s.max_exp_avg_sq());
    }
    const AdamHyper h{o.lr(),
                      std::get<0>(o.betas()),
                      std::get<1>(o.betas()),
                      o.weight_decay(),
                      o.eps(),
                      o.amsgrad(),
                      decoupled};
    for (Batch& b : batches)
      adam_step(b, h, found_inf);
  }
}

// Takes back the step counts that step_adam advanced.
template <typename State>
void take_back_steps(std::vector<State*>& stepped) {
  for (State* s : std::exchange(stepped, {}))
    s->step(s->step() - 1);
}

}  // namespace

torch::Tensor FusedAdamW::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss = loss_of(closure);
  step_adam<torch::optim::AdamWParamState, torch::optim::AdamWOptions>(
      *this, true, std::exchange(found_inf_, at::Tensor()), stepped_);
  return loss;
}

void FusedAdamW::undo_skipped_step() {
  take_back_steps(stepped_);
}

torch::Tensor FusedAdam::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss = loss_of(closure);
  step_adam<torch::optim::AdamParamState, torch::optim::AdamOptions>(
      *this, false, std::exchange(found_inf_, at::Tensor()), stepped_);
  return loss;
}

void FusedAdam::undo_skipped_step() {
  take_back_steps(stepped_);
}

torch::Tensor FusedSGD::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss = loss_of(closure);
  const at::Tensor found_inf = std::exchange(found_inf_, at::Tensor());
  first_.clear();
  if (skipped_on_host(found_inf)) return loss;
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const torch::optim::SGDOptions&>(group.options());
    const bool momentum = o.momentum() != 0;
    // Batch::step is 1 for parameters whose momentum buffer exists, 0 for their first step;
    // `first` holds the buffers.
    std::vector<Batch> batches;
    for (const auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      const at::Tensor& g = gradient_of(p);
      torch::optim::SGDParamState* s = nullptr;
      if (momentum) {
        auto& slot = state()[compat::optimizer_state_key(p)];
        if (!slot) slot = std::make_unique<torch::optim::SGDParamState>();
        s = static_cast<torch::optim::SGDParamState*>(slot.get());
      }
      const bool first = s && !s->momentum_buffer().defined();
      Batch& b = batch_for(batches, p, first ? 0 : 1);
      b.params.push_back(p);
      b.grads.push_back(g);
      if (!s) continue;
      // The fused kernel fills a first step's buffer; the foreach path clones into it below.
      if (first) {
        s->momentum_buffer(at::empty_like(g, at::MemoryFormat::Preserve));
        first_.push_back(s);
      }
      b.first.push_back(s->momentum_buffer());
    }
    for (Batch& b : batches) {
      const bool first = b.step == 0;
#if DTORCH_FUSED_KERNELS
      at::_fused_sgd_(b.params, b.grads, b.first, o.weight_decay(), o.momentum(), o.lr(),
                      o.dampening(), o.nesterov(), /*maximize=*/false, first && momentum,
                      c10::nullopt, flag_of(found_inf));
#else
      // torch.optim's _multi_tensor_sgd.
      TensorVec d = b.grads;
      if (o.weight_decay() != 0) d = at::_foreach_add(b.grads, b.params, o.weight_decay());
      if (momentum) {
        if (first) {
          for (size_t i = 0; i < d.size(); ++i)
            b.first[i].copy_(d[i]);
        } else {
          at::_foreach_mul_(b.first, o.momentum());
          at::_foreach_add_(b.first, d, 1 - o.dampening());
        }
        d = o.nesterov() ? at::_foreach_add(d, b.first, o.momentum()) : b.first;
      }
      at::_foreach_add_(b.params, d, -o.lr());
#endif
    }
  }
  return loss;
}

void FusedSGD::undo_skipped_step() {
  for (auto* s : std::exchange(first_, {}))
    s->momentum_buffer(at::Tensor());  // the skipped step never filled it
}

void step_unless(torch::optim::Optimizer& opt, const at::Tensor& found_inf) {
  if (auto* skippable = dynamic_cast<SkippableStep*>(&opt)) {
    skippable->skip_where(found_inf);
  } else if (set_on_host(found_inf)) {
    return;
  }
  opt.step();
}

HiddenGradients::HiddenGradients(std::vector<at::Tensor> params) : params_(std::move(params)) {
  for (auto& p : params_)
    grads_.push_back(std::exchange(p.mutable_grad(), at::Tensor()));
}

HiddenGradients::~HiddenGradients() {
  for (size_t k = 0; k < params_.size(); ++k)
    params_[k].mutable_grad() = grads_[k];
}

bool skipped_over_nothing(torch::optim::Optimizer& opt, const at::Tensor& found_inf) {
  if (!set_on_host(found_inf)) return false;
  step_unless(opt, found_inf);  // Note [Steps a part at a time]
  return true;
}

void undo_skipped_step(torch::optim::Optimizer& opt) {
  if (auto* skippable = dynamic_cast<SkippableStep*>(&opt)) skippable->undo_skipped_step();
}

const char* fused_kernels() {
  return DTORCH_FUSED_KERNELS ? "fused" : "foreach";
}

}  // namespace dtorch::optim
