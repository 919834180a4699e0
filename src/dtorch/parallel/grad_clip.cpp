// Note [Clipping on the device].
#include "dtorch/parallel/grad_clip.h"

#include "dtorch/core/error.h"

namespace dtorch::parallel {

at::Tensor sum_of_squares(const std::vector<at::Tensor>& grads, at::Device device) {
  at::Tensor sq = at::zeros({1}, at::TensorOptions(at::kDouble).device(device));
  for (const auto& g : grads)
    if (g.defined()) sq += g.to(at::kDouble).pow(2).sum();
  return sq;
}

at::Tensor clip_to_norm(const std::vector<at::Tensor>& grads, const at::Tensor& squares,
                        double max_norm) {
  DTORCH_CHECK_T(ConfigError, max_norm > 0, "clip-grad-norm must be positive (got ", max_norm, ")");
  const at::Tensor norm = squares.clamp_min(0).sqrt().reshape({});
  const at::Tensor coef = (max_norm / (norm + 1e-6)).clamp_max(1.0);
  at::Tensor in_dtype;  // the coefficient in the gradients' dtype (one dtype in practice)
  for (const auto& g : grads) {
    if (!g.defined()) continue;
    if (!in_dtype.defined() || in_dtype.scalar_type() != g.scalar_type())
      in_dtype = coef.to(g.scalar_type());
    g.mul_(in_dtype);
  }
  return norm;
}

}  // namespace dtorch::parallel
