// Attention by either kernel; the explicit path is the reference the fused one is tested
// against (models/attention_test.cpp).
#include "dtorch/models/attention.h"

#include <cmath>
#include <limits>

#include "dtorch/core/error.h"
#include "dtorch/core/torch_compat.h"

namespace dtorch::models {

AttentionKernel parse_attention_kernel(const std::string& name) {
  if (name == "auto") return AttentionKernel::Auto;
  if (name == "explicit") return AttentionKernel::Explicit;
  if (name == "fused") return AttentionKernel::Fused;
  DTORCH_FAIL(ConfigError, "attention kernel '", name, "' is not one of auto, explicit, fused");
}

torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        bool causal, AttentionKernel kernel) {
  DTORCH_CHECK_T(ConfigError, kernel != AttentionKernel::Fused || compat::kHasFusedAttention,
                 "fused attention needs LibTorch 2.x (this build uses ", TORCH_VERSION,
                 "); use the explicit kernel");
  if (kernel != AttentionKernel::Explicit && compat::kHasFusedAttention) {
    return compat::fused_attention(q, k, v, causal);
  }
  const int64_t T = q.size(-2);
  torch::Tensor att = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(double(q.size(-1)));
  if (causal) {
    torch::Tensor future =
        torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool).device(q.device())).triu(1);
    att = att.masked_fill(future, -std::numeric_limits<double>::infinity());
  }
  return torch::matmul(torch::softmax(att, -1), v);
}

torch::Tensor pack_heads(const torch::Tensor& qkv, int64_t head_dim) {
  const int64_t B = qkv.size(0), T = qkv.size(1), heads = qkv.size(2) / (3 * head_dim);
  return qkv.view({B, T, 3, heads, head_dim}).permute({2, 0, 3, 1, 4});
}

std::array<torch::Tensor, 3> unpack_heads(const torch::Tensor& packed) {
  // Back to B x T x 3 x heads x head_dim, qkv's layout: unbind's backward stacks the three
  // gradients there, and the views above it need no copy.
  auto parts = packed.permute({1, 3, 0, 2, 4}).unbind(2);
  return {parts[0].transpose(1, 2), parts[1].transpose(1, 2), parts[2].transpose(1, 2)};
}

}  // namespace dtorch::models
