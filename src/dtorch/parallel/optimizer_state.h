// The per-parameter state of the optimizers dtorch trains with (SGD's momentum, Adam's and
// AdamW's moments and step count), read and rebuilt without knowing which one it is: sharded
// checkpoints, tensor-parallel layouts and memory reports all need it.
#pragma once

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace dtorch::parallel {

/// The state tensors shaped like their parameter, by name ("exp_avg", "exp_avg_sq",
/// "max_exp_avg_sq" when amsgrad, "momentum_buffer"); undefined ones left out. Throws
/// ConfigError for an optimizer other than SGD, Adam and AdamW.
std::vector<std::pair<std::string, at::Tensor>> state_tensors(
    const torch::optim::OptimizerParamState& state);

/// A copy of `state` whose parameter-shaped tensors are `f` of the originals (scalars such as
/// Adam's step are kept): how a state follows its parameter when that is split or joined.
std::unique_ptr<torch::optim::OptimizerParamState> map_state(
    const torch::optim::OptimizerParamState& state,
    const std::function<at::Tensor(const at::Tensor&)>& f);

/// A twin of `opt` (the same kind, parameter groups and options, over the same parameters)
/// holding map_state(state, copy) for each of opt's states: what a checkpoint made later, on
/// another thread, serializes while `opt` steps on (its parameters are only its state's keys
/// there). ConfigError for an optimizer other than SGD, Adam and AdamW.
std::unique_ptr<torch::optim::Optimizer> snapshot_optimizer(
    const torch::optim::Optimizer& opt, const std::function<at::Tensor(const at::Tensor&)>& copy);

/// The state `opt` would give parameter `p` before its first step (zero moments, step 0; SGD's
/// zero momentum buffer), so a checkpoint can be loaded into it; nullptr for SGD without
/// momentum, which keeps none.
std::unique_ptr<torch::optim::OptimizerParamState> fresh_state(torch::optim::Optimizer& opt,
                                                               const at::Tensor& p);

/// Moves every state tensor of `opt` to its parameter's device (after loading a checkpoint
/// written on another device).
void move_state_to_parameters(torch::optim::Optimizer& opt);

/// Bytes of every state tensor `opt` holds.
int64_t state_bytes(torch::optim::Optimizer& opt);

/// Adam(W)'s step count; 0 for SGD.
int64_t steps_of(const torch::optim::OptimizerParamState& state);
/// Sets Adam(W)'s step count; nothing for SGD.
void set_steps(torch::optim::OptimizerParamState& state, int64_t steps);

}  // namespace dtorch::parallel
