// Mixed-precision compute on the CPU: a scope in which matmuls and convolutions run in
// bfloat16 while precision-sensitive ops (softmax, norms, losses) stay in float32. LibTorch
// 1.13 and 2.x name the switches differently (Note [CPU autocast switches]).
#pragma once

#include <ATen/autocast_mode.h>

#include "dtorch/core/torch_compat.h"

namespace dtorch::parallel {

/// Turns CPU autocast on with `dtype` for its lifetime (when `enabled`), restoring the
/// previous state after; the cast cache is cleared when the outermost scope ends, as
/// torch.autocast does.
class CpuAutocast {
 public:
  explicit CpuAutocast(bool enabled, at::ScalarType dtype = at::kBFloat16) : enabled_(enabled) {
    if (!enabled_) return;
    was_enabled_ = compat::cpu_autocast_enabled();
    was_dtype_ = compat::cpu_autocast_dtype();
    compat::set_cpu_autocast(true, dtype);
    at::autocast::increment_nesting();
  }
  ~CpuAutocast() {
    if (!enabled_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    compat::set_cpu_autocast(was_enabled_, was_dtype_);
  }
  CpuAutocast(const CpuAutocast&) = delete;
  CpuAutocast& operator=(const CpuAutocast&) = delete;

 private:
  bool enabled_;
  bool was_enabled_ = false;
  at::ScalarType was_dtype_ = at::kBFloat16;
};

}  // namespace dtorch::parallel
