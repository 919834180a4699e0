// Backward in two halves for zero-bubble schedules: the input gradient now (it is on the
// pipeline's critical path), the weight gradients later (Note [Split backward]).
#pragma once

#include <torch/types.h>

#include <memory>
#include <vector>

namespace dtorch::pp {

/// Note [Split backward]: B computes only the gradient of a stage's input. The autograd
/// engine skips every output a node computes that no requested input needs, so the weight
/// gradients of a Linear (its mm with the weight) are not computed; B keeps the graph and
/// records, with a pre-hook, the gradient arriving at each "weight node" (a node with an edge
/// into a parameter, through at most a few single-edge nodes such as a transpose). W then
/// runs each weight node again, from its recorded gradient, towards its own parameters only,
/// which accumulate into .grad as in a normal backward (PyTorch's pipelining does the same in
/// stage_backward_input / stage_backward_weight). Parameters B could not reach (the first
/// stage has no input gradient at all) or that hang off several weight nodes (a weight used
/// twice) get theirs in W from the stage's output, the ordinary way.
class SplitBackward {
 public:
  /// B: the gradient of `root` (seeded with `grad`; undefined for a scalar loss) with
  /// respect to `input` (undefined when the stage's input takes no gradient: then nothing
  /// runs now). Returns it (undefined without input); the graph is kept for weights().
  static std::pair<SplitBackward, at::Tensor> input_gradient(const at::Tensor& root,
                                                             const at::Tensor& grad,
                                                             const at::Tensor& input,
                                                             const std::vector<at::Tensor>& params);
  /// W: accumulates every parameter's gradient into .grad and releases the graph. Once.
  void weights();

  SplitBackward();
  ~SplitBackward();
  SplitBackward(SplitBackward&&) noexcept;
  SplitBackward& operator=(SplitBackward&&) noexcept;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace dtorch::pp
