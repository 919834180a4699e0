// Scaled dot-product attention, the one computation gpt and vit share: the explicit
// softmax(q k^T / sqrt(d)) v that every LibTorch has, or LibTorch 2.x's fused kernel (Note
// [Fused attention] in core/torch_compat.h). Models pick the kernel through their config.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <array>
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

/// B x T x 3 heads head_dim (q | k | v, each head-major) -> 3 x B x heads x T x head_dim, the
/// attention core's input, as a view.
torch::Tensor pack_heads(const torch::Tensor& qkv, int64_t head_dim);

/// Note [Unpacking q, k and v]: q, k and v of a pack_heads() view, each B x heads x T x
/// head_dim, as views whose backward is one stack into qkv's own layout. Indexing the packed
/// tensor (packed[0], packed[1], packed[2]) costs, in backward, three zero-filled copies of the
/// whole of it, a copy of each gradient into one, two sums of them, and a copy that undoes the
/// permutation: on an H200, 0.21 ms of gpt-small's block at 8 x 1024 tokens, against 0.02 ms.
std::array<torch::Tensor, 3> unpack_heads(const torch::Tensor& packed);

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
    auto [q, k, v] = unpack_heads(qkv);
    return attention(q, k, v, causal_, kernel_);
  }
  bool causal() const { return causal_; }
  AttentionKernel kernel() const { return kernel_; }

 private:
  bool causal_;
  AttentionKernel kernel_;
};
TORCH_MODULE(AttentionCore);

}  // namespace dtorch::models
