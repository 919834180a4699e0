// The one place outside comm/ that knows how LibTorch 1.13 (Debian 12) and 2.x (PyPI's torch
// wheel, what GPU users have) differ. Everything else in dtorch calls these names and compiles
// unchanged against both; each difference has a Note saying what changed and why it matters.
#pragma once

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/core/Allocator.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/version.h>

#include <string>
#include <utility>

namespace dtorch::compat {

/// True when built against LibTorch 2.x.
constexpr bool kTorch2 = TORCH_VERSION_MAJOR >= 2;

// Note [Optimizer state key]
// torch::optim::Optimizer::state() maps a parameter to its state. LibTorch 1.13 keys it by a
// string of the parameter's TensorImpl address (c10::guts::to_string, gone in 2.x); 2.x keys
// it by the TensorImpl pointer itself. Code that reads or seeds an optimizer's state (ZeRO's
// flat shards) asks this function for the key instead of building it.
#if TORCH_VERSION_MAJOR >= 2
using OptimizerStateKey = void*;
inline OptimizerStateKey optimizer_state_key(const at::Tensor& p) {
  return p.unsafeGetTensorImpl();
}
#else
using OptimizerStateKey = std::string;
inline OptimizerStateKey optimizer_state_key(const at::Tensor& p) {
  return c10::guts::to_string(p.unsafeGetTensorImpl());
}
#endif

// Note [Autograd node handles]
// DDP and ZeRO keep each parameter's gradient accumulator alive to hang their gradient-ready
// hooks on it (the parameter holds it only weakly). LibTorch 1.13 (and 2.x up to about 2.9)
// hands it out as a std::shared_ptr<Node>, later 2.x as a c10::intrusive_ptr<Node>; this
// alias is whatever grad_accumulator() returns, so both compile without a version test.
using GradAccumulator =
    decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));
/// Any autograd node, as an edge of the graph holds it (the same change of pointer type).
using NodeHandle = decltype(torch::autograd::Edge::function);

// Note [Allocator reports]
// An allocator reports each allocation to the thread's c10::MemoryReportingInfoBase with the
// running totals; 1.13 passes them as int64_t, 2.x as size_t. This alias is the type the
// installed LibTorch declares, read off reportMemoryUsage, so an override compiles on both.
namespace detail {
template <class>
struct TotalOf;
template <class C, class R, class Ptr, class Size, class Total, class... Rest>
struct TotalOf<R (C::*)(Ptr, Size, Total, Rest...)> {
  using type = Total;
};
}  // namespace detail
using AllocatorTotal =
    detail::TotalOf<decltype(&c10::MemoryReportingInfoBase::reportMemoryUsage)>::type;

// Note [Allocator interface]
// c10::Allocator::allocate is const in 1.13 and 2.0-2.2; 2.3 dropped the const and added
// copy_data, pure virtual. dtorch's CPU allocator (core/freed_memory.cpp) derives from this
// class and defines allocate_bytes, which every version's allocate forwards to.
struct Allocator : c10::Allocator {
  virtual at::DataPtr allocate_bytes(size_t nbytes) const = 0;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  at::DataPtr allocate(size_t nbytes) override {
    return allocate_bytes(nbytes);
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#else
  at::DataPtr allocate(size_t nbytes) const override {
    return allocate_bytes(nbytes);
  }
#endif
};

// Note [Autocast switches]
// 1.13 has a function per device (CPU: set_cpu_enabled, set_autocast_cpu_dtype; CUDA:
// set_enabled, set_autocast_gpu_dtype); 2.4+ takes the device type as an argument and
// deprecates the old names. dtorch autocasts on the CPU and on CUDA only.
inline bool autocast_enabled(at::DeviceType device) {
#if TORCH_VERSION_MAJOR >= 2
  return at::autocast::is_autocast_enabled(device);
#else
  return device == at::kCUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
#endif
}
inline at::ScalarType autocast_dtype(at::DeviceType device) {
#if TORCH_VERSION_MAJOR >= 2
  return at::autocast::get_autocast_dtype(device);
#else
  return device == at::kCUDA ? at::autocast::get_autocast_gpu_dtype()
                             : at::autocast::get_autocast_cpu_dtype();
#endif
}
inline void set_autocast(at::DeviceType device, bool enabled, at::ScalarType dtype) {
#if TORCH_VERSION_MAJOR >= 2
  at::autocast::set_autocast_enabled(device, enabled);
  at::autocast::set_autocast_dtype(device, dtype);
#else
  if (device == at::kCUDA) {
    at::autocast::set_enabled(enabled);
    at::autocast::set_autocast_gpu_dtype(dtype);
  } else {
    at::autocast::set_cpu_enabled(enabled);
    at::autocast::set_autocast_cpu_dtype(dtype);
  }
#endif
}

// Note [Fused attention]
// 2.x has at::scaled_dot_product_attention: one call that picks a fused kernel (flash or
// memory-efficient attention on CUDA, a blocked kernel on CPU) and never materialises the
// T x T attention matrix, with a causal mask built in. 1.13 has none, so there attention is
// the explicit softmax(q k^T / sqrt(d)) v. Both compute the same function (tested within
// 1e-5, models/attention_test.cpp).
constexpr bool kHasFusedAttention = TORCH_VERSION_MAJOR >= 2;

/// q, k, v: batch x heads x tokens x head_dim. Only callable when kHasFusedAttention.
inline at::Tensor fused_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  bool causal) {
#if TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, causal);
#else
  TORCH_CHECK(false, "fused attention needs LibTorch 2.x (this is ", TORCH_VERSION, ")");
#endif
}

}  // namespace dtorch::compat
