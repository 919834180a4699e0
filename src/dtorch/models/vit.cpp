// ViT code: torchvision's module tree rebuilt from plain modules (LibTorch's own
// MultiheadAttention is sequence-first only), so names and numerics match vit_b_16's class.
#include "dtorch/models/vit.h"

#include <torch/nn/functional/activation.h>
#include <torch/nn/init.h>

#include <algorithm>
#include <cmath>

#include "dtorch/core/error.h"
#include "dtorch/models/module_hooks.h"
#include "dtorch/models/unit_seeds.h"

namespace dtorch::models {
namespace nn = torch::nn;

SelfAttentionImpl::SelfAttentionImpl(int64_t dim, int64_t num_heads, AttentionKernel kernel)
    : head_dim_(dim / num_heads) {
  // nn.MultiheadAttention._reset_parameters: xavier-uniform in_proj, zero biases.
  in_proj_weight_ = register_parameter("in_proj_weight", torch::empty({3 * dim, dim}));
  in_proj_bias_ = register_parameter("in_proj_bias", torch::zeros({3 * dim}));
  core_ = register_module("core", AttentionCore(/*causal=*/false, kernel));
  out_proj_ = register_module("out_proj", nn::Linear(dim, dim));
  torch::NoGradGuard no_grad;
  nn::init::xavier_uniform_(in_proj_weight_);
  nn::init::zeros_(out_proj_->bias);
}

torch::Tensor SelfAttentionImpl::forward(torch::Tensor x) {
  // in_proj's output is q | k | v, each head-major; under tensor parallelism this rank's heads
  // only. Note [Attention core]: under context parallelism T is this rank's part of the
  // sequence.
  torch::Tensor qkv = torch::linear(x, in_proj_weight_, in_proj_bias_);
  const int64_t B = x.size(0), T = x.size(1), C = qkv.size(2) / 3;
  torch::Tensor y = call(core_, pack_heads(qkv, head_dim_)).transpose(1, 2).reshape({B, T, C});
  return call(out_proj_, y);
}

EncoderBlockImpl::EncoderBlockImpl(int64_t dim, int64_t num_heads, int64_t mlp_dim,
                                   AttentionKernel kernel) {
  ln_1_ = register_module("ln_1", nn::LayerNorm(nn::LayerNormOptions({dim}).eps(1e-6)));
  self_attention_ = register_module("self_attention", SelfAttention(dim, num_heads, kernel));
  ln_2_ = register_module("ln_2", nn::LayerNorm(nn::LayerNormOptions({dim}).eps(1e-6)));
  // A module named "mlp" whose children are "0" and "3", the indices of the two Linears in
  // torchvision's MLPBlock (Linear, GELU, Dropout, Linear, Dropout).
  auto mlp = register_module("mlp", std::make_shared<nn::Module>());
  fc1_ = mlp->register_module("0", nn::Linear(dim, mlp_dim));
  fc2_ = mlp->register_module("3", nn::Linear(mlp_dim, dim));
  // torchvision's MLPBlock: xavier-uniform weights, biases normal(std=1e-6).
  torch::NoGradGuard no_grad;
  for (auto& fc : {fc1_, fc2_}) {
    nn::init::xavier_uniform_(fc->weight);
    nn::init::normal_(fc->bias, 0.0, 1e-6);
  }
}

torch::Tensor EncoderBlockImpl::forward(torch::Tensor x) {
  x = x + call(self_attention_, call(ln_1_, x));
  torch::Tensor h = call(fc2_, torch::gelu(call(fc1_, call(ln_2_, x))));
  return x + h;
}

VisionTransformer::VisionTransformer(const ViTConfig& c, UnitRange units) : config_(c) {
  DTORCH_CHECK_T(ConfigError, c.patch_size > 0 && c.image_size % c.patch_size == 0,
                 "ViT patch size ", c.patch_size, " must divide the image size ", c.image_size,
                 ": use --image-size ",
                 c.patch_size * std::max<int64_t>(1, c.image_size / c.patch_size),
                 " (a multiple of ", c.patch_size, ")");
  DTORCH_CHECK_T(ConfigError, c.num_heads > 0 && c.hidden_dim % c.num_heads == 0, "ViT hidden_dim ",
                 c.hidden_dim, " must be a multiple of num_heads ", c.num_heads);
  set_units(units);
  UnitSeeds seeds(*this);
  const int64_t patches = (c.image_size / c.patch_size) * (c.image_size / c.patch_size);
  std::shared_ptr<nn::Module> encoder;
  auto get_encoder = [&] {
    if (!encoder) encoder = register_module("encoder", std::make_shared<nn::Module>());
    return encoder;
  };
  if (holds_unit(0)) {
    seeds.enter(0);
    class_token_ = register_parameter("class_token", torch::zeros({1, 1, c.hidden_dim}));
    conv_proj_ = register_module(
        "conv_proj",
        nn::Conv2d(
            nn::Conv2dOptions(c.in_channels, c.hidden_dim, c.patch_size).stride(c.patch_size)));
    pos_embedding_ = get_encoder()->register_parameter(
        "pos_embedding", torch::empty({1, patches + 1, c.hidden_dim}));
    // torchvision's VisionTransformer.__init__: patch embedding normal with std
    // sqrt(1 / fan_in) truncated at +-2 (absolute, so many standard deviations out: LibTorch
    // 1.13 has no trunc_normal_, and clamping only matters beyond them), zero conv bias,
    // normal(0.02) positions, zero class token.
    torch::NoGradGuard no_grad;
    const double fan_in = double(c.in_channels * c.patch_size * c.patch_size);
    nn::init::normal_(conv_proj_->weight, 0.0, std::sqrt(1.0 / fan_in)).clamp_(-2.0, 2.0);
    nn::init::zeros_(conv_proj_->bias);
    nn::init::normal_(pos_embedding_, 0.0, 0.02);
  }
  std::shared_ptr<nn::Module> layers;
  first_layer_ = std::max(0, this->units().begin - 1);
  for (int64_t i = first_layer_; i < c.num_layers && holds_unit(static_cast<int>(i) + 1); ++i) {
    if (!layers) layers = get_encoder()->register_module("layers", std::make_shared<nn::Module>());
    seeds.enter(static_cast<int>(i) + 1);
    layers_.push_back(
        layers->register_module("encoder_layer_" + std::to_string(i),
                                EncoderBlock(c.hidden_dim, c.num_heads, c.mlp_dim, c.attention)));
  }
  const int head = static_cast<int>(c.num_layers) + 1;
  if (holds_unit(head)) {
    seeds.enter(head);
    ln_ = get_encoder()->register_module(
        "ln", nn::LayerNorm(nn::LayerNormOptions({c.hidden_dim}).eps(1e-6)));
    auto heads = register_module("heads", std::make_shared<nn::Module>());
    head_ = heads->register_module("head", nn::Linear(c.hidden_dim, c.num_classes));
  }
  seeds.finish(num_units());
}

torch::Tensor VisionTransformer::forward(torch::Tensor x) {
  return run_forward(std::move(x), [this](torch::Tensor x) { return run_units(std::move(x)); });
}

torch::Tensor VisionTransformer::run_units(torch::Tensor x) {
  if (holds_unit(0)) {
    const int64_t B = x.size(0);
    // B x C x H x W -> B x hidden x h x w -> B x (h w) x hidden, patches in row-major order.
    x = conv_proj_->forward(x).flatten(2).transpose(1, 2);
    x = torch::cat({class_token_.expand({B, -1, -1}), x}, 1) + pos_embedding_;
  }
  const auto names = block_names();
  for (size_t i = 0; i < layers_.size(); ++i)
    x = run_block(names[i], x, [this, i](torch::Tensor t) { return call(layers_[i], t); });
  if (!head_) return x;
  x = call(ln_, x);
  return call(head_, x.select(1, 0));
}

std::vector<std::string> VisionTransformer::block_names() const {
  std::vector<std::string> names;
  for (size_t i = 0; i < layers_.size(); ++i)
    names.push_back("encoder.layers.encoder_layer_" + std::to_string(first_layer_ + int64_t(i)));
  return names;
}

std::vector<std::string> VisionTransformer::unit_names() const {
  std::vector<std::string> names = {"embedding"};
  for (int64_t i = 0; i < config_.num_layers; ++i)
    names.push_back("encoder.layers.encoder_layer_" + std::to_string(i));
  names.push_back("head");
  return names;
}

TensorPlan VisionTransformer::tensor_parallel_plan(int tp) const {
  // Attention by heads and the MLP by hidden units; the patch embedding, the class head and the
  // norms stay whole.
  check_tensor_split(tp, config_.num_heads, "attention heads", "this ViT");
  check_tensor_split(tp, config_.mlp_dim, "MLP width", "this ViT");
  return {
      // in_proj_weight / in_proj_bias are the attention module's own parameters.
      {"encoder.layers.*.self_attention", TensorSplit::Colwise, 3},
      {"encoder.layers.*.self_attention.out_proj", TensorSplit::Rowwise},
      {"encoder.layers.*.mlp.0", TensorSplit::Colwise},
      {"encoder.layers.*.mlp.3", TensorSplit::Rowwise},
  };
}

Workload VisionTransformer::workload() const {
  const ViTConfig& c = config_;
  const int64_t patches = (c.image_size / c.patch_size) * (c.image_size / c.patch_size);
  const int64_t C = c.hidden_dim, M = c.mlp_dim,
                patch = c.in_channels * c.patch_size * c.patch_size;
  Workload w;
  w.layers = c.num_layers;
  w.hidden = C;
  w.heads = c.num_heads;
  w.mlp = M;
  w.classes = c.num_classes;
  w.tokens = patches + 1;
  w.patch_flops = 2.0 * double(patches * C * patch);
  // A block keeps its input, ln_1's and ln_2's outputs and the residual sum whole (4 C), and
  // in_proj's q | k | v, the attention's output, fc1's and GELU's outputs split (3 C + C + 2 M,
  // 12 C at M = 4 C): vit-tiny kept 239 MB in forward at 32 images a rank where these are 236 MB
  // (50 tokens, 12 blocks), and the attention matrices 23 MB more, which LibTorch 2.x's fused
  // attention does not keep.
  w.whole_activations = 4;
  w.split_activations = 4 + 2.0 * double(M) / double(C);
  // The embedding (conv_proj, class_token, pos_embedding); a block (ln_1, in_proj, out_proj,
  // ln_2, mlp.0, mlp.3); the head (encoder.ln, heads.head).
  w.unit_parameters.push_back(patch * C + C + C + (patches + 1) * C);
  w.unit_parameters.insert(w.unit_parameters.end(), c.num_layers,
                           2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + C * M + M + M * C + C);
  w.unit_parameters.push_back(2 * C + C * c.num_classes + c.num_classes);
  return w;
}

Model::ContextPlan VisionTransformer::context_parallel_plan() const {
  const int64_t side = config_.image_size / config_.patch_size;
  return {config_.num_heads, "", "encoder.layers.encoder_layer_0", "encoder.ln", side * side + 1};
}

}  // namespace dtorch::models
