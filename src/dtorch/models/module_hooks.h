// Forward hooks on any submodule, which LibTorch's C++ modules lack: a parallelism applied to
// a model (tensor parallelism) maps a module's input or output, or replaces its forward,
// without the model knowing. Models call their children through call().
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <functional>
#include <memory>

namespace dtorch::models {

/// Note [Module hooks]: Python's register_forward_pre_hook / register_forward_hook, for C++.
/// A model runs each child through call(child, x), which applies the hooks installed on that
/// child: x = pre(x); y = forward ? forward(x) : child->forward(x); y = post(y). Hooks live
/// in one process-wide table keyed by module, so model files stay architecture only and a
/// module without hooks costs one atomic load. A module destroyed with hooks installed drops
/// them (the table holds weak references).
struct ModuleHooks {
  /// Maps the module's input; may be empty.
  std::function<torch::Tensor(torch::Tensor)> pre;
  /// Runs in place of the module's forward (with the module's own, possibly resharded,
  /// parameters); may be empty.
  std::function<torch::Tensor(torch::Tensor)> forward;
  /// Maps the module's output; may be empty.
  std::function<torch::Tensor(torch::Tensor)> post;
};

/// Installs `hooks` on `module` (which must be owned by a shared_ptr, as every registered
/// submodule is), replacing any it had.
void set_module_hooks(torch::nn::Module& module, ModuleHooks hooks);
/// Removes the hooks of `module`, if any.
void clear_module_hooks(torch::nn::Module& module);
/// The hooks of `module`, or null.
std::shared_ptr<const ModuleHooks> module_hooks(const torch::nn::Module& module);

/// Runs `child` (a ModuleHolder such as torch::nn::Linear, or a shared_ptr to a module) on
/// `x` through its hooks.
template <class Holder>
torch::Tensor call(Holder& child, torch::Tensor x) {
  auto hooks = module_hooks(*child);
  if (!hooks) return child->forward(std::move(x));
  if (hooks->pre) x = hooks->pre(std::move(x));
  torch::Tensor y = hooks->forward ? hooks->forward(std::move(x)) : child->forward(std::move(x));
  return hooks->post ? hooks->post(std::move(y)) : y;
}

}  // namespace dtorch::models
