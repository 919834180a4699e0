// Mixed-precision compute: a scope in which matmuls and convolutions run in bfloat16 or float16
// while precision-sensitive ops (softmax, norms, losses) stay in float32, on the CPU or on CUDA
// (torch.autocast). LibTorch 1.13 and 2.x name the switches differently (Note [Autocast
// switches] in core/torch_compat.h).
#pragma once

#include <ATen/autocast_mode.h>

#include "dtorch/core/torch_compat.h"

namespace dtorch::parallel {

/// What forward runs under: autocast to `dtype` on `device`, or nothing (enabled false).
struct AutocastMode {
  bool enabled = false;
  at::DeviceType device = at::kCPU;
  at::ScalarType dtype = at::kBFloat16;
};

/// The mode autocast is in now on `device`.
inline AutocastMode current_autocast(at::DeviceType device) {
  return {compat::autocast_enabled(device), device, compat::autocast_dtype(device)};
}

/// Puts `mode.device` into `mode` for its lifetime (turning autocast off there when the mode
/// is not enabled and `exact`), restoring the previous state after; the cast cache is cleared
/// when the outermost enabled scope ends, as torch.autocast does.
class Autocast {
 public:
  explicit Autocast(const AutocastMode& mode, bool exact = false)
      : mode_(mode), was_(current_autocast(mode.device)), touched_(mode.enabled || exact) {
    if (!touched_) return;
    compat::set_autocast(mode.device, mode.enabled, mode.dtype);
    if (mode.enabled) at::autocast::increment_nesting();
  }
  ~Autocast() {
    if (!touched_) return;
    if (mode_.enabled && at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    compat::set_autocast(was_.device, was_.enabled, was_.dtype);
  }
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  AutocastMode mode_;
  AutocastMode was_;
  bool touched_;
};

}  // namespace dtorch::parallel
