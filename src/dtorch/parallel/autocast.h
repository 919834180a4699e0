// Mixed-precision compute on the CPU: a scope in which matmuls and convolutions run in
// bfloat16 while precision-sensitive ops (softmax, norms, losses) stay in float32. LibTorch
// 1.13 and 2.x name the switches differently; this is the one place that knows both.
#pragma once

#include <ATen/autocast_mode.h>
#include <torch/version.h>

namespace dtorch::parallel {

/// Turns CPU autocast on with `dtype` for its lifetime (when `enabled`), restoring the
/// previous state after; the cast cache is cleared when the outermost scope ends, as
/// torch.autocast does.
class CpuAutocast {
 public:
  explicit CpuAutocast(bool enabled, at::ScalarType dtype = at::kBFloat16) : enabled_(enabled) {
    if (!enabled_) return;
#if TORCH_VERSION_MAJOR >= 2
    was_enabled_ = at::autocast::is_autocast_enabled(at::kCPU);
    was_dtype_ = at::autocast::get_autocast_dtype(at::kCPU);
    at::autocast::set_autocast_enabled(at::kCPU, true);
    at::autocast::set_autocast_dtype(at::kCPU, dtype);
#else
    was_enabled_ = at::autocast::is_cpu_enabled();
    was_dtype_ = at::autocast::get_autocast_cpu_dtype();
    at::autocast::set_cpu_enabled(true);
    at::autocast::set_autocast_cpu_dtype(dtype);
#endif
    at::autocast::increment_nesting();
  }
  ~CpuAutocast() {
    if (!enabled_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
#if TORCH_VERSION_MAJOR >= 2
    at::autocast::set_autocast_enabled(at::kCPU, was_enabled_);
    at::autocast::set_autocast_dtype(at::kCPU, was_dtype_);
#else
    at::autocast::set_cpu_enabled(was_enabled_);
    at::autocast::set_autocast_cpu_dtype(was_dtype_);
#endif
  }
  CpuAutocast(const CpuAutocast&) = delete;
  CpuAutocast& operator=(const CpuAutocast&) = delete;

 private:
  bool enabled_;
  bool was_enabled_ = false;
  at::ScalarType was_dtype_ = at::kBFloat16;
};

}  // namespace dtorch::parallel
