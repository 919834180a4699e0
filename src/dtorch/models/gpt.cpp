// GPT code: nanoGPT's model.py rebuilt module for module, with causal attention from
// models/attention.h (fused on LibTorch 2.x) and the output layer tied to wte.
#include "dtorch/models/gpt.h"

#include <torch/nn/init.h>
#include <torch/nn/modules/container/modulelist.h>

#include <cmath>

#include "dtorch/core/error.h"
#include "dtorch/models/module_hooks.h"

namespace dtorch::models {
namespace nn = torch::nn;

int64_t gpt_num_parameters(const GPTConfig& c) {
  const int64_t d = c.n_embd;
  const int64_t per_block = 2 * d                // ln_1
                            + d * 3 * d + 3 * d  // attn.c_attn
                            + d * d + d          // attn.c_proj
                            + 2 * d              // ln_2
                            + d * 4 * d + 4 * d  // mlp.c_fc
                            + 4 * d * d + d;     // mlp.c_proj
  return c.vocab_size * d + c.block_size * d + c.n_layer * per_block + 2 * d;
}

CausalSelfAttentionImpl::CausalSelfAttentionImpl(int64_t dim, int64_t num_heads,
                                                 AttentionKernel kernel)
    : head_dim_(dim / num_heads), kernel_(kernel) {
  c_attn_ = register_module("c_attn", nn::Linear(dim, 3 * dim));
  c_proj_ = register_module("c_proj", nn::Linear(dim, dim));
}

torch::Tensor CausalSelfAttentionImpl::forward(torch::Tensor x) {
  // Sizes come from c_attn's output, not from x or the config: under tensor parallelism it
  // holds this rank's heads only (and the whole sequence when x is a sequence shard).
  torch::Tensor qkv = call(c_attn_, x);
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3, hs = head_dim_;
  auto parts = qkv.split(C, /*dim=*/2);
  auto heads = [&](const torch::Tensor& t) {
    return t.view({B, T, C / hs, hs}).transpose(1, 2);  // B x nh x T x hs
  };
  torch::Tensor q = heads(parts[0]), k = heads(parts[1]), v = heads(parts[2]);
  torch::Tensor y =
      attention(q, k, v, /*causal=*/true, kernel_).transpose(1, 2).contiguous().view({B, T, C});
  return call(c_proj_, y);
}

GPTBlockImpl::GPTBlockImpl(int64_t dim, int64_t num_heads, AttentionKernel kernel) {
  ln_1_ = register_module("ln_1", nn::LayerNorm(nn::LayerNormOptions({dim})));
  attn_ = register_module("attn", CausalSelfAttention(dim, num_heads, kernel));
  ln_2_ = register_module("ln_2", nn::LayerNorm(nn::LayerNormOptions({dim})));
  auto mlp = register_module("mlp", std::make_shared<nn::Module>());
  c_fc_ = mlp->register_module("c_fc", nn::Linear(dim, 4 * dim));
  c_proj_ = mlp->register_module("c_proj", nn::Linear(4 * dim, dim));
}

torch::Tensor GPTBlockImpl::forward(torch::Tensor x) {
  x = x + call(attn_, call(ln_1_, x));
  return x + call(c_proj_, torch::gelu(call(c_fc_, call(ln_2_, x))));
}

GPT::GPT(const GPTConfig& c) : config_(c) {
  DTORCH_CHECK_T(ConfigError, c.n_head > 0 && c.n_embd % c.n_head == 0, "GPT n_embd ", c.n_embd,
                 " must be a multiple of n_head ", c.n_head);
  DTORCH_CHECK_T(ConfigError, c.vocab_size > 0 && c.block_size > 0 && c.n_layer > 0,
                 "GPT needs positive vocab_size, block_size and n_layer");
  auto transformer = register_module("transformer", std::make_shared<nn::Module>());
  wte_ = transformer->register_module("wte", nn::Embedding(c.vocab_size, c.n_embd));
  wpe_ = transformer->register_module("wpe", nn::Embedding(c.block_size, c.n_embd));
  nn::ModuleList h;
  for (int64_t i = 0; i < c.n_layer; ++i) {
    h_.push_back(GPTBlock(c.n_embd, c.n_head, c.attention));
    h->push_back(h_.back());
  }
  transformer->register_module("h", h);
  ln_f_ = transformer->register_module("ln_f", nn::LayerNorm(nn::LayerNormOptions({c.n_embd})));

  // nanoGPT's _init_weights, then the scaled residual projections (GPT-2 paper).
  torch::NoGradGuard no_grad;
  for (auto& kv : named_parameters()) {
    const std::string& name = kv.key();
    torch::Tensor p = kv.value();
    auto ends_with = [&](const std::string& s) {
      return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
    };
    if (name.find(".ln_") != std::string::npos) continue;  // LayerNorm: default 1 and 0
    if (ends_with(".bias")) {
      p.zero_();
    } else if (ends_with("c_proj.weight")) {
      p.normal_(0.0, 0.02 / std::sqrt(2.0 * c.n_layer));
    } else {
      p.normal_(0.0, 0.02);
    }
  }
}

torch::Tensor GPT::forward(torch::Tensor idx) {
  DTORCH_CHECK_T(ConfigError, idx.dim() == 2 && idx.scalar_type() == torch::kLong,
                 "GPT takes int64 token ids of shape B x T, got ", idx.scalar_type(), " ",
                 idx.sizes());
  const int64_t T = idx.size(1);
  DTORCH_CHECK_T(ConfigError, T <= config_.block_size, "sequence of length ", T,
                 " is longer than the model's block size ", config_.block_size,
                 ": use a sequence length of at most ", config_.block_size);
  torch::Tensor pos =
      torch::arange(T, torch::TensorOptions().dtype(torch::kLong).device(idx.device()));
  torch::Tensor x = call(wte_, idx) + call(wpe_, pos);
  const auto names = block_names();
  for (size_t i = 0; i < h_.size(); ++i)
    x = run_block(names[i], x, [&](torch::Tensor t) { return call(h_[i], t); });
  // Note [Tied embedding]: the output layer is the token embedding.
  return torch::linear(call(ln_f_, x), wte_->weight);
}

std::vector<std::string> GPT::block_names() const {
  std::vector<std::string> names;
  for (int64_t i = 0; i < config_.n_layer; ++i)
    names.push_back("transformer.h." + std::to_string(i));
  return names;
}

}  // namespace dtorch::models
