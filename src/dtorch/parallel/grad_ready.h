// One engine for "start communicating a group of gradients as soon as backward has produced
// all of them": DDP's buckets and ZeRO's units both run on it and supply only what to do with
// a gradient and with a full group (Note [Gradient readiness]).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dtorch/core/torch_compat.h"

namespace dtorch::parallel {

// Note [Gradient readiness]
// A hook after each parameter's gradient accumulator tells the engine that the parameter's
// gradient for this backward is final. The first hook of a backward pass starts a step:
// every group's pending count is reset and a callback is queued on the autograd engine that
// runs once the whole backward is done (finalize). Each hook hands the gradient to its group
// (absorb) and, when that was the group's last one, launches every group that is complete,
// strictly in the given launch order: groups complete in a different order on different
// ranks (autograd's thread, unused branches), and collectives must be issued in the same
// order everywhere (Note [Bucket order]). Finalize deals with parameters that received no
// gradient (absorbed as they are, meaning zeros, or reported by name), waits for what was
// launched and lets the owner put the results in place (complete).
// Outside a synchronised step (set_sync(false): no_sync, accumulation) the hooks do nothing
// and gradients accumulate in .grad; reduce_accumulated() then runs one step by hand.

class GradReadiness {
 public:
  struct Policy {
    std::string who;           ///< starts error messages: "DDP", "ZeRO-2"
    bool fill_unused = false;  ///< a parameter without a gradient is absorbed as zeros at the
                               ///< end of backward; otherwise the step fails naming it
    std::string unused_hint;   ///< what to do about parameters without a gradient
    std::string twice_hint;    ///< what to do when a parameter's gradient arrives twice
  };
  struct Callbacks {
    /// Takes parameter i's gradient for its group (an undefined .grad counts as zeros).
    std::function<void(size_t param)> absorb;
    /// Starts the communication of a complete group.
    std::function<void(size_t group)> launch;
    /// At the end of backward: waits for the first `launched` groups of the launch order.
    std::function<void(size_t launched)> wait;
    /// After every group was launched and waited for: puts the results in place.
    std::function<void()> complete;
  };

  /// `group_of[i]`: the group of params[i]; `launch_order`: every group once, in the order
  /// their communication starts on every rank.
  GradReadiness(std::vector<at::Tensor> params, std::vector<std::string> names,
                std::vector<size_t> group_of, std::vector<size_t> launch_order, Policy policy,
                Callbacks callbacks);
  ~GradReadiness();
  GradReadiness(const GradReadiness&) = delete;
  GradReadiness& operator=(const GradReadiness&) = delete;

  /// Off: backward accumulates in .grad and nothing is absorbed or launched.
  void set_sync(bool sync) { sync_ = sync; }
  bool sync() const { return sync_; }
  /// Between the first gradient of a synchronised backward and its finalize.
  bool in_backward() const { return in_backward_; }

  /// Called by the hook on parameter i's gradient accumulator.
  void on_grad_ready(size_t i);
  /// Outside backward: absorbs every gradient as it is and runs one step (launch in order,
  /// wait, complete). Collective.
  void reduce_accumulated();

 private:
  void prepare_for_backward();
  void mark_ready(size_t i);
  void launch_ready();
  void finalize();
  [[noreturn]] void fail_unready() const;

  std::vector<at::Tensor> params_;
  std::vector<std::string> names_;
  std::vector<size_t> group_of_, launch_order_;
  Policy policy_;
  Callbacks callbacks_;
  std::vector<size_t> group_size_, pending_;
  std::vector<bool> ready_;
  std::vector<compat::GradAccumulator> accumulators_;  // parameters hold them weakly
  std::vector<uintptr_t> hook_keys_;
  size_t next_launch_ = 0;  // position in launch_order_
  bool in_backward_ = false;
  bool sync_ = true;
};

}  // namespace dtorch::parallel
