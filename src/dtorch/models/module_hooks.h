// Forward hooks on any submodule, which LibTorch's C++ modules lack: a parallelism applied to
// a model (tensor parallelism) maps a module's input or output, or replaces its forward,
// without the model knowing. Models call their children through call().
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
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
  /// Runs the module's forward (`forward` above, else the module's own) as run(x): a block's
  /// hooks and runner (Note [Your own model]) wrap it as a models::Model's run_block() does.
  /// `run` stays callable after call() returns (activation checkpointing calls it again in
  /// backward). May be empty.
  std::function<torch::Tensor(torch::Tensor x,
                              const std::function<torch::Tensor(torch::Tensor)>& run)>
      around;
};

/// Installs `hooks` on `module` (which must be owned by a shared_ptr, as every registered
/// submodule is), replacing any it had.
void set_module_hooks(torch::nn::Module& module, ModuleHooks hooks);
/// Removes the hooks of `module`, if any.
void clear_module_hooks(torch::nn::Module& module);
/// Changes the fields of `module`'s hooks that `edit` sets or clears (it sees the hooks the
/// module has, or none) and keeps the rest: a unit's `around` (Note [Your own model]) and a
/// split's `forward` (tensor parallelism) sit on one module, each put there and taken off by
/// its own parallelism. Hooks left all empty are removed.
void edit_module_hooks(torch::nn::Module& module, const std::function<void(ModuleHooks&)>& edit);
/// The hooks of `module`, or null.
std::shared_ptr<const ModuleHooks> module_hooks(const torch::nn::Module& module);

/// Note [Linear through aten::linear]: LibTorch's C++ nn::Linear (torch::nn::functional::linear)
/// runs an input of more than two dimensions as a matmul and then `output += bias`, where
/// Python's nn.Linear calls aten::linear, which flattens a contiguous input into one addmm
/// with the bias in the GEMM's epilogue. Under autocast the C++ bias also stays fp32, so its
/// add is a second, unvectorised kernel over the whole output: on an H200, 3 ms of gpt-small's
/// 30 ms step at 8 x 1024 tokens. call() runs a Linear the Python way.
inline torch::Tensor forward_of(torch::nn::LinearImpl& linear, torch::Tensor x) {
  return torch::linear(x, linear.weight, linear.bias);
}
template <class Module>
torch::Tensor forward_of(Module& module, torch::Tensor x) {
  return module.forward(std::move(x));
}

/// Runs `child` (a ModuleHolder such as torch::nn::Linear, or a shared_ptr to a module) on
/// `x` through its hooks.
template <class Holder>
torch::Tensor call(Holder& child, torch::Tensor x) {
  auto hooks = module_hooks(*child);
  if (!hooks) return forward_of(*child, std::move(x));
  if (hooks->pre) x = hooks->pre(std::move(x));
  torch::Tensor y;
  if (hooks->around) {
    // Holds the module and its hooks by value: `around` may run it again in backward.
    y = hooks->around(std::move(x), [child, hooks](torch::Tensor in) mutable {
      return hooks->forward ? hooks->forward(std::move(in)) : forward_of(*child, std::move(in));
    });
  } else {
    y = hooks->forward ? hooks->forward(std::move(x)) : forward_of(*child, std::move(x));
  }
  return hooks->post ? hooks->post(std::move(y)) : y;
}

}  // namespace dtorch::models
