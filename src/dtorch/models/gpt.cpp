// GPT code: nanoGPT's model.py rebuilt module for module, with causal attention from
// models/attention.h (fused on LibTorch 2.x) and the output layer tied to wte.
#include "dtorch/models/gpt.h"

#include <torch/nn/init.h>

#include <algorithm>
#include <cmath>

#include "dtorch/core/error.h"
#include "dtorch/models/module_hooks.h"
#include "dtorch/models/unit_seeds.h"

namespace dtorch::models {
namespace nn = torch::nn;

namespace {

int64_t block_parameters(const GPTConfig& c) {
  const int64_t d = c.n_embd;
  return 2 * d                // ln_1
         + d * 3 * d + 3 * d  // attn.c_attn
         + d * d + d          // attn.c_proj
         + 2 * d              // ln_2
         + d * 4 * d + 4 * d  // mlp.c_fc
         + 4 * d * d + d;     // mlp.c_proj
}

}  // namespace

int64_t gpt_num_parameters(const GPTConfig& c) {
  const int64_t d = c.n_embd;
  return c.vocab_size * d + c.block_size * d + c.n_layer * block_parameters(c) + 2 * d;
}

CausalSelfAttentionImpl::CausalSelfAttentionImpl(int64_t dim, int64_t num_heads,
                                                 AttentionKernel kernel)
    : head_dim_(dim / num_heads) {
  c_attn_ = register_module("c_attn", nn::Linear(dim, 3 * dim));
  c_proj_ = register_module("c_proj", nn::Linear(dim, dim));
  core_ = register_module("core", AttentionCore(/*causal=*/true, kernel));
}

torch::Tensor CausalSelfAttentionImpl::forward(torch::Tensor x) {
  // Sizes come from c_attn's output, not from x or the config: under tensor parallelism it
  // holds this rank's heads only (and the whole sequence when x is a sequence shard).
  torch::Tensor qkv = call(c_attn_, x);
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3;
  // Note [Attention core]: under context parallelism T is this rank's part of the sequence.
  torch::Tensor y = call(core_, pack_heads(qkv, head_dim_)).transpose(1, 2).contiguous();
  return call(c_proj_, y.view({B, T, C}));
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

namespace {

/// nanoGPT's _init_weights, then the scaled residual projections (GPT-2 paper), on the
/// parameters of one unit.
void init_unit(nn::Module& unit, int64_t n_layer) {
  torch::NoGradGuard no_grad;
  for (auto& kv : unit.named_parameters()) {
    const std::string& name = kv.key();
    torch::Tensor p = kv.value();
    auto ends_with = [&](const std::string& s) {
      return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
    };
    if (name.find("ln_") != std::string::npos) continue;  // LayerNorm: default 1 and 0
    if (ends_with("bias")) {
      p.zero_();
    } else if (ends_with("c_proj.weight")) {
      p.normal_(0.0, 0.02 / std::sqrt(2.0 * n_layer));
    } else {
      p.normal_(0.0, 0.02);
    }
  }
}

}  // namespace

GPT::GPT(const GPTConfig& c, UnitRange units) : config_(c) {
  DTORCH_CHECK_T(ConfigError, c.n_head > 0 && c.n_embd % c.n_head == 0, "GPT n_embd ", c.n_embd,
                 " must be a multiple of n_head ", c.n_head);
  DTORCH_CHECK_T(ConfigError, c.vocab_size > 0 && c.block_size > 0 && c.n_layer > 0,
                 "GPT needs positive vocab_size, block_size and n_layer");
  set_units(units);
  const int head = static_cast<int>(c.n_layer) + 1;
  UnitSeeds seeds(*this);
  auto transformer = register_module("transformer", std::make_shared<nn::Module>());
  if (holds_unit(0) || holds_unit(head)) {
    // Note [Tied embedding]: the head's wte is built from the embedding's seed, so a stage
    // holding the head alone starts with the same weights.
    seeds.enter(0);
    wte_ = transformer->register_module("wte", nn::Embedding(c.vocab_size, c.n_embd));
    init_unit(*wte_, c.n_layer);
    if (holds_unit(0)) {
      wpe_ = transformer->register_module("wpe", nn::Embedding(c.block_size, c.n_embd));
      init_unit(*wpe_, c.n_layer);
    }
  }
  first_block_ = std::max(0, this->units().begin - 1);
  std::shared_ptr<nn::Module> h;
  for (int64_t i = first_block_; i < c.n_layer && holds_unit(static_cast<int>(i) + 1); ++i) {
    // Registered before the block is built, so UnitSeeds sees it (Note [Deferred
    // initialisation]).
    if (!h) h = transformer->register_module("h", std::make_shared<nn::Module>());
    seeds.enter(static_cast<int>(i) + 1);
    h_.push_back(h->register_module(std::to_string(i), GPTBlock(c.n_embd, c.n_head, c.attention)));
    init_unit(*h_.back(), c.n_layer);
  }
  if (holds_unit(head)) {
    seeds.enter(head);
    ln_f_ = transformer->register_module("ln_f", nn::LayerNorm(nn::LayerNormOptions({c.n_embd})));
  }
  seeds.finish(num_units());
}

torch::Tensor GPT::forward(torch::Tensor x) {
  return run_forward(std::move(x), [this](torch::Tensor x) { return run_units(std::move(x)); });
}

torch::Tensor GPT::run_units(torch::Tensor x) {
  if (holds_unit(0)) {
    DTORCH_CHECK_T(ConfigError, x.dim() == 2 && x.scalar_type() == torch::kLong,
                   "GPT takes int64 token ids of shape B x T, got ", x.scalar_type(), " ",
                   x.sizes());
    const int64_t T = x.size(1);
    DTORCH_CHECK_T(ConfigError, T <= config_.block_size, "sequence of length ", T,
                   " is longer than the model's block size ", config_.block_size,
                   ": use a sequence length of at most ", config_.block_size);
    torch::Tensor pos =
        torch::arange(T, torch::TensorOptions().dtype(torch::kLong).device(x.device()));
    x = call(wte_, x) + call(wpe_, pos);
  }
  const auto names = block_names();
  for (size_t i = 0; i < h_.size(); ++i)
    x = run_block(names[i], x, [this, i](torch::Tensor t) { return call(h_[i], t); });
  if (!holds_unit(static_cast<int>(config_.n_layer) + 1)) return x;
  // Note [Tied embedding]: the output layer is the token embedding.
  return torch::linear(call(ln_f_, x), wte_->weight);
}

std::vector<std::string> GPT::block_names() const {
  std::vector<std::string> names;
  for (size_t i = 0; i < h_.size(); ++i)
    names.push_back("transformer.h." + std::to_string(first_block_ + int64_t(i)));
  return names;
}

std::vector<std::string> GPT::unit_names() const {
  std::vector<std::string> names = {"embedding"};
  for (int64_t i = 0; i < config_.n_layer; ++i)
    names.push_back("transformer.h." + std::to_string(i));
  names.push_back("head");
  return names;
}

Workload GPT::workload() const {
  const GPTConfig& c = config_;
  Workload w;
  w.layers = c.n_layer;
  w.hidden = c.n_embd;
  w.heads = c.n_head;
  w.mlp = 4 * c.n_embd;
  w.tokens = c.block_size;
  w.vocab = c.vocab_size;
  // A block's tensors: 4 C whole and 16 C split per token (gpt-small and gpt-large at 2 and 4
  // ranks, BENCHMARKS.md's plan table).
  w.whole_activations = 4;
  w.split_activations = 16;
  // The embeddings (wte, wpe), the blocks, the head (ln_f and its copy of the tied wte).
  w.unit_parameters.push_back((c.vocab_size + c.block_size) * c.n_embd);
  w.unit_parameters.insert(w.unit_parameters.end(), c.n_layer, block_parameters(c));
  w.unit_parameters.push_back(2 * c.n_embd + c.vocab_size * c.n_embd);
  return w;
}

TensorPlan GPT::tensor_parallel_plan(int tp) const {
  // Attention by heads, the MLP by hidden units, the embedding by vocabulary; Note [Tied
  // embedding]: the head is wte, split by vocabulary, so the final norm's output enters it.
  check_tensor_split(tp, config_.n_head, "attention heads", "this GPT");
  check_tensor_split(tp, config_.vocab_size, "vocabulary", "this GPT");
  return {
      {"transformer.wte", TensorSplit::VocabEmbedding},
      {"transformer.h.*.attn.c_attn", TensorSplit::Colwise, 3},
      {"transformer.h.*.attn.c_proj", TensorSplit::Rowwise},
      {"transformer.h.*.mlp.c_fc", TensorSplit::Colwise},
      {"transformer.h.*.mlp.c_proj", TensorSplit::Rowwise},
      {"transformer.ln_f", TensorSplit::EnterVocabRegion},
  };
}

}  // namespace dtorch::models
