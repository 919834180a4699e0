// Scaled dot-product attention, the one computation gpt and vit share: the explicit
// softmax(q k^T / sqrt(d)) v that every LibTorch has, or LibTorch 2.x's fused kernel (Note
// [Fused attention] in core/torch_compat.h). Models pick the kernel through their config.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
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

/// Note [Attention core]: a transformer block's attention() as a module of its own, without
/// parameters, so that a parallelism can replace it (module_hooks.h) as torchtitan's
/// context_parallel replaces scaled_dot_product_attention: context parallelism runs it as
/// ring attention or Ulysses (parallel/cp). Its input is q, k and v packed, 3 x B x heads x T x
/// head_dim (a view of a fused projection's B x T x 3 heads head_dim output, no copy); its
/// output B x heads x T x head_dim.
class AttentionCoreImpl : public torch::nn::Module {
 public:
  AttentionCoreImpl(bool causal, AttentionKernel kernel) : causal_(causal), kernel_(kernel) {}
  torch::Tensor forward(const torch::Tensor& qkv) {
    return attention(qkv[0], qkv[1], qkv[2], causal_, kernel_);
  }
  bool causal() const { return causal_; }
  AttentionKernel kernel() const { return kernel_; }

 private:
  bool causal_;
  AttentionKernel kernel_;
};
TORCH_MODULE(AttentionCore);

/// B x T x 3 heads head_dim (q | k | v, each head-major) -> 3 x B x heads x T x head_dim, the
/// attention core's input, as a view.
torch::Tensor pack_heads(const torch::Tensor& qkv, int64_t head_dim);

}  // namespace dtorch::models
