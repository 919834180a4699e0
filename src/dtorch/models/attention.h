// Scaled dot-product attention, the one computation gpt and vit share: the explicit
// softmax(q k^T / sqrt(d)) v that every LibTorch has, or LibTorch 2.x's fused kernel (Note
// [Fused attention] in core/torch_compat.h). Models pick the kernel through their config.
#pragma once

#include <torch/types.h>

#include <string>

namespace dtorch::models {

enum class AttentionKernel {
  /// Fused where the LibTorch has it (2.x), explicit otherwise.
  Auto,
  /// softmax(q k^T / sqrt(d)) v with the T x T matrix materialised: LibTorch 1.13's only way.
  Explicit,
  /// at::scaled_dot_product_attention; an error on LibTorch 1.13.
  Fused,
};

/// Parses "auto", "explicit" or "fused"; throws ConfigError naming the value otherwise.
AttentionKernel parse_attention_kernel(const std::string& name);

/// q, k, v: batch x heads x tokens x head_dim -> the same shape. With `causal`, token t
/// attends to tokens 0..t only.
torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        bool causal, AttentionKernel kernel = AttentionKernel::Auto);

}  // namespace dtorch::models
