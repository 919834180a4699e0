// Optimizer state of SGD, Adam and AdamW, one place that knows their state classes (see
// optimizer_state.h).
#include "dtorch/parallel/optimizer_state.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "dtorch/core/error.h"
#include "dtorch/core/torch_compat.h"

namespace dtorch::parallel {
namespace {

using torch::optim::OptimizerParamState;

[[noreturn]] void unknown_optimizer() {
  DTORCH_FAIL(ConfigError, "dtorch knows the optimizer state of SGD, Adam and AdamW only (for ",
              "sharding, tensor-parallel layouts and checkpoints); use one of them");
}

// Adam and AdamW keep the same fields in two unrelated classes.
template <class State, class F>
bool with_adam(OptimizerParamState& s, F&& f) {
  auto* a = dynamic_cast<State*>(&s);
  if (a) f(*a);
  return a != nullptr;
}

template <class F>
bool with_either_adam(OptimizerParamState& s, F&& f) {
  return with_adam<torch::optim::AdamWParamState>(s, f) ||
         with_adam<torch::optim::AdamParamState>(s, f);
}

template <class State, class Options>
std::unique_ptr<State> fresh_adam(torch::optim::Optimizer& opt, const at::Tensor& p) {
  auto st = std::make_unique<State>();
  st->step(0);
  st->exp_avg(at::zeros_like(p));
  st->exp_avg_sq(at::zeros_like(p));
  if (static_cast<Options&>(opt.param_groups()[0].options()).amsgrad()) {
    st->max_exp_avg_sq(at::zeros_like(p));
  }
  return st;
}

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> state_tensors(const OptimizerParamState& state) {
  auto& s = const_cast<OptimizerParamState&>(state);  // read only; the accessors are not const
  std::vector<std::pair<std::string, at::Tensor>> out;
  auto add = [&](const char* name, const at::Tensor& t) {
    if (t.defined()) out.emplace_back(name, t);
  };
  bool adam = with_either_adam(s, [&](auto& a) {
    add("exp_avg", a.exp_avg());
    add("exp_avg_sq", a.exp_avg_sq());
    add("max_exp_avg_sq", a.max_exp_avg_sq());
  });
  if (adam) return out;
  auto* g = dynamic_cast<torch::optim::SGDParamState*>(&s);
  if (!g) unknown_optimizer();
  add("momentum_buffer", g->momentum_buffer());
  return out;
}

std::unique_ptr<OptimizerParamState> map_state(
    const OptimizerParamState& state, const std::function<at::Tensor(const at::Tensor&)>& f) {
  auto out = state.clone();
  auto map = [&](const at::Tensor& t) { return t.defined() ? f(t) : t; };
  bool adam = with_either_adam(*out, [&](auto& a) {
    a.exp_avg(map(a.exp_avg()));
    a.exp_avg_sq(map(a.exp_avg_sq()));
    a.max_exp_avg_sq(map(a.max_exp_avg_sq()));
  });
  if (adam) return out;
  auto* g = dynamic_cast<torch::optim::SGDParamState*>(out.get());
  if (!g) unknown_optimizer();
  g->momentum_buffer(map(g->momentum_buffer()));
  return out;
}

std::unique_ptr<OptimizerParamState> fresh_state(torch::optim::Optimizer& opt,
                                                 const at::Tensor& p) {
  if (dynamic_cast<torch::optim::AdamW*>(&opt)) {
    return fresh_adam<torch::optim::AdamWParamState, torch::optim::AdamWOptions>(opt, p);
  }
  if (dynamic_cast<torch::optim::Adam*>(&opt)) {
    return fresh_adam<torch::optim::AdamParamState, torch::optim::AdamOptions>(opt, p);
  }
  auto* sgd = dynamic_cast<torch::optim::SGD*>(&opt);
  if (!sgd) unknown_optimizer();
  auto& o = static_cast<torch::optim::SGDOptions&>(sgd->param_groups()[0].options());
  if (o.momentum() == 0) return nullptr;
  auto st = std::make_unique<torch::optim::SGDParamState>();
  st->momentum_buffer(at::zeros_like(p));
  return st;
}

std::unique_ptr<torch::optim::Optimizer> snapshot_optimizer(
    const torch::optim::Optimizer& opt, const std::function<at::Tensor(const at::Tensor&)>& copy) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (const auto& g : opt.param_groups())
    groups.emplace_back(g.params(), g.options().clone());
  std::unique_ptr<torch::optim::Optimizer> twin;
  if (dynamic_cast<const torch::optim::AdamW*>(&opt)) {
    twin = std::make_unique<torch::optim::AdamW>(
        groups, static_cast<const torch::optim::AdamWOptions&>(opt.defaults()));
  } else if (dynamic_cast<const torch::optim::Adam*>(&opt)) {
    twin = std::make_unique<torch::optim::Adam>(
        groups, static_cast<const torch::optim::AdamOptions&>(opt.defaults()));
  } else if (dynamic_cast<const torch::optim::SGD*>(&opt)) {
    twin = std::make_unique<torch::optim::SGD>(
        groups, static_cast<const torch::optim::SGDOptions&>(opt.defaults()));
  } else {
    unknown_optimizer();
  }
  for (const auto& [key, state] : opt.state())
    twin->state()[key] = map_state(*state, copy);
  return twin;
}

void move_state_to_parameters(torch::optim::Optimizer& opt) {
  for (auto& group : opt.param_groups()) {
    for (auto& p : group.params()) {
      auto it = opt.state().find(compat::optimizer_state_key(p));
      if (it == opt.state().end()) continue;
      bool elsewhere = false;
      for (auto& [name, t] : state_tensors(*it->second))
        elsewhere = elsewhere || t.device() != p.device();
      if (elsewhere) {
        it->second = map_state(*it->second, [&](const at::Tensor& t) { return t.to(p.device()); });
      }
    }
  }
}

int64_t state_bytes(torch::optim::Optimizer& opt) {
  int64_t total = 0;
  for (auto& [key, st] : opt.state()) {
    for (auto& [name, t] : state_tensors(*st))
      total += static_cast<int64_t>(t.nbytes());
  }
  return total;
}

int64_t steps_of(const OptimizerParamState& state) {
  int64_t steps = 0;
  with_either_adam(const_cast<OptimizerParamState&>(state), [&](auto& a) { steps = a.step(); });
  return steps;
}

void set_steps(OptimizerParamState& state, int64_t steps) {
  with_either_adam(state, [&](auto& a) { a.step(steps); });
}

}  // namespace dtorch::parallel
