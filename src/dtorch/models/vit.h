// Vision Transformer with torchvision's vit_b_16 parameter names (conv_proj, class_token,
// encoder.layers.encoder_layer_N, heads.head), sized for 28x28 Fashion-MNIST images.
#pragma once

#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dtorch/models/attention.h"
#include "dtorch/models/model.h"

namespace dtorch::models {

/// Shape of a ViT.
struct ViTConfig {
  int64_t image_size = 28;
  /// Square patch side; must divide image_size.
  int64_t patch_size = 4;
  int64_t in_channels = 1;
  int64_t num_layers = 12;
  int64_t num_heads = 3;
  /// Token width; must be a multiple of num_heads.
  int64_t hidden_dim = 192;
  /// Width of each block's MLP.
  int64_t mlp_dim = 768;
  int64_t num_classes = 10;
  /// Attention kernel: fused on LibTorch 2.x by default (models/attention.h).
  AttentionKernel attention = AttentionKernel::Auto;

  /// ViT-Ti/4 (192 wide, 12 layers, 3 heads) on 28x28: 49 patches and a class token.
  static ViTConfig tiny() { return {}; }
  /// 2 layers, 2 heads, 32 wide, 7x7 patches: a step takes milliseconds.
  static ViTConfig debug() { return {28, 7, 1, 2, 2, 32, 64, 10}; }
};

/// torchvision's nn.MultiheadAttention parameters (in_proj_weight, in_proj_bias, out_proj)
/// with scaled dot-product attention over all tokens (no mask), batch first.
class SelfAttentionImpl : public torch::nn::Module {
 public:
  SelfAttentionImpl(int64_t dim, int64_t num_heads, AttentionKernel kernel = AttentionKernel::Auto);
  /// x: B x T x dim -> B x T x dim.
  torch::Tensor forward(torch::Tensor x);

 private:
  int64_t head_dim_;
  torch::Tensor in_proj_weight_, in_proj_bias_;
  AttentionCore core_{nullptr};
  torch::nn::Linear out_proj_{nullptr};
};
TORCH_MODULE(SelfAttention);

/// torchvision's EncoderBlock: x + attn(ln_1(x)), then + mlp(ln_2(x)) with mlp = Linear
/// ("mlp.0"), GELU, Linear ("mlp.3"), as the Sequential indices of torchvision's MLPBlock.
class EncoderBlockImpl : public torch::nn::Module {
 public:
  EncoderBlockImpl(int64_t dim, int64_t num_heads, int64_t mlp_dim,
                   AttentionKernel kernel = AttentionKernel::Auto);
  torch::Tensor forward(torch::Tensor x);

 private:
  torch::nn::LayerNorm ln_1_{nullptr}, ln_2_{nullptr};
  SelfAttention self_attention_{nullptr};
  torch::nn::Linear fc1_{nullptr}, fc2_{nullptr};
};
TORCH_MODULE(EncoderBlock);

/// "vit-tiny", "vit-debug": torchvision's VisionTransformer (the class behind vit_b_16),
/// name for name: conv_proj (patch embedding as a conv), class_token, encoder.pos_embedding,
/// encoder.layers.encoder_layer_N.{ln_1, self_attention, ln_2, mlp.0, mlp.3}, encoder.ln,
/// heads.head; pre-norm, LayerNorm eps 1e-6, exact GELU, no dropout. The torchvision
/// equivalent is VisionTransformer(28, patch, layers, heads, hidden, mlp, num_classes=10)
/// with conv_proj replaced by a 1-channel conv. Input B x 1 x 28 x 28, output B x 10.
/// Initialised as torchvision does, except the head: torchvision zeroes it, which would
/// make a fresh model's logits all zero; here it keeps Linear's default.
///
/// Pipeline units (Note [Pipeline units]): "embedding" (conv_proj, class_token,
/// encoder.pos_embedding: image -> B x (patches + 1) x hidden), one per encoder layer,
/// "head" (encoder.ln, heads.head); each unit from its own seed (Note [Unit seeds]).
class VisionTransformer : public Model {
 public:
  explicit VisionTransformer(const ViTConfig& config, UnitRange units = {});
  torch::Tensor forward(torch::Tensor x) override;
  bool scopes_forward() const override { return true; }
  /// The layers this instance holds: "encoder.layers.encoder_layer_0", ...
  std::vector<std::string> block_names() const override;
  std::vector<std::string> unit_names() const override;
  const ViTConfig& config() const { return config_; }
  /// Megatron's split (tensor_plan.h); its rules live in the model's source file.
  TensorPlan tensor_parallel_plan(int tp) const override;
  /// The class token and the patches are split at the first encoder layer and gathered whole at
  /// encoder.ln (Note [Padded sequences]).
  ContextPlan context_parallel_plan() const override;
  /// Its shape with its patches and class token as tokens, its patch embedding's FLOPs, its
  /// blocks' kept tensors, its units' sizes.
  Workload workload() const override;

 private:
  ViTConfig config_;
  torch::nn::Conv2d conv_proj_{nullptr};
  torch::Tensor class_token_, pos_embedding_;
  std::vector<EncoderBlock> layers_;
  int64_t first_layer_ = 0;  // index of layers_[0] among the model's layers
  torch::nn::LayerNorm ln_{nullptr};
  torch::nn::Linear head_{nullptr};

  // forward() between the forward hooks: this instance's units in order.
  torch::Tensor run_units(torch::Tensor x);
};

}  // namespace dtorch::models
