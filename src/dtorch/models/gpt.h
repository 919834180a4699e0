// A decoder-only transformer with nanoGPT's parameter names (transformer.wte, transformer.h.N,
// ...), the language model the tutorials' FSDP and ZeRO examples train: GPT-2 small and a tiny one.
#pragma once

#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dtorch/models/attention.h"
#include "dtorch/models/model.h"

namespace dtorch::models {

/// Shape of a GPT (nanoGPT's GPTConfig, with bias on and dropout off).
struct GPTConfig {
  /// Longest sequence the learned position table covers.
  int64_t block_size = 1024;
  /// Token ids are 0..vocab_size-1.
  int64_t vocab_size = 50304;
  int64_t n_layer = 12;
  int64_t n_head = 12;
  /// Embedding width; must be a multiple of n_head.
  int64_t n_embd = 768;
  /// Attention kernel: fused on LibTorch 2.x by default (models/attention.h).
  AttentionKernel attention = AttentionKernel::Auto;

  /// GPT-2 small with nanoGPT's vocabulary padded from 50257 to 50304 (a multiple of 64):
  /// 124,475,904 parameters.
  static GPTConfig small() { return {}; }
  /// GPT-2 large (36 layers, 20 heads, 1280 wide), same vocabulary: 774,090,240 parameters,
  /// whose fp32 AdamW training state (16 bytes each, 12.4 GB) fits no two ranks of a 24 GiB
  /// machine unsharded.
  static GPTConfig large() { return {1024, 50304, 36, 20, 1280}; }
  /// GPT-2 XL (48 layers, 25 heads, 1600 wide; nanoGPT's gpt2-xl), same vocabulary:
  /// 1,557,686,400 parameters, whose fp32 AdamW state (25 GB) is more than a 24 GiB machine
  /// holds at any layout; it trains there with the optimizer on disk (Note [Optimizer state on
  /// disk]).
  static GPTConfig xl() { return {1024, 50304, 48, 25, 1600}; }
  /// Byte-level (vocab 256), 32 positions, 2 layers, 4 heads of 8, 32 wide (4 heads, so
  /// that tensor parallelism splits it 2 and 4 ways).
  static GPTConfig debug() { return {32, 256, 2, 4, 32}; }
  /// gpt-debug's width at 1024 positions and 4 blocks: the long sequences context parallelism
  /// splits, at a size every test can run.
  static GPTConfig long_debug() { return {1024, 256, 4, 4, 32}; }
};

/// How many parameters a GPT of this shape has (each counted once: the output projection
/// is the token embedding).
int64_t gpt_num_parameters(const GPTConfig& config);

/// nanoGPT's CausalSelfAttention: c_attn (dim -> 3 dim), causal softmax attention, c_proj.
class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  CausalSelfAttentionImpl(int64_t dim, int64_t num_heads,
                          AttentionKernel kernel = AttentionKernel::Auto);
  /// x: B x T x dim -> B x T x dim; token t attends to tokens 0..t.
  torch::Tensor forward(torch::Tensor x);

 private:
  int64_t head_dim_;
  torch::nn::Linear c_attn_{nullptr}, c_proj_{nullptr};
  AttentionCore core_{nullptr};
};
TORCH_MODULE(CausalSelfAttention);

/// nanoGPT's Block: x + attn(ln_1(x)), then x + mlp(ln_2(x)), mlp = c_fc (4x), GELU, c_proj.
class GPTBlockImpl : public torch::nn::Module {
 public:
  GPTBlockImpl(int64_t dim, int64_t num_heads, AttentionKernel kernel = AttentionKernel::Auto);
  torch::Tensor forward(torch::Tensor x);

 private:
  torch::nn::LayerNorm ln_1_{nullptr}, ln_2_{nullptr};
  CausalSelfAttention attn_{nullptr};
  torch::nn::Linear c_fc_{nullptr}, c_proj_{nullptr};
};
TORCH_MODULE(GPTBlock);

/// "gpt-debug", "gpt-small": nanoGPT's GPT. Parameters transformer.wte.weight,
/// transformer.wpe.weight, transformer.h.N.{ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc,
/// mlp.c_proj}.{weight, bias}, transformer.ln_f.{weight, bias}; learned positions, pre-norm,
/// exact GELU, no dropout.
///
/// Note [Tied embedding]: the logits are x @ transformer.wte.weight^T. There is no lm_head
/// parameter, so every parameter appears exactly once (for sharding, gradient buckets and
/// optimizer state). Python's nanoGPT ties by assignment (lm_head.weight = wte.weight), so its
/// state_dict has one extra key, lm_head.weight, sharing transformer.wte.weight's storage:
/// python_aliases() names it, the files dtorch writes for torch.load hold it the same way
/// (one storage, two keys: nanoGPT loads them with strict=True), and loading here accepts
/// and drops it. nanoGPT without flash attention also has a causal-mask buffer attn.bias
/// per block; here the mask is built in forward and is not part of the state.
///
/// Input int64 token ids B x T (T <= block_size), output logits B x T x vocab_size.
/// Initialised as nanoGPT: Linear and Embedding weights normal(0, 0.02), biases zero,
/// LayerNorm 1/0, and each residual projection (attn.c_proj, mlp.c_proj) normal with std
/// 0.02 / sqrt(2 n_layer), each unit from its own seed (Note [Unit seeds]).
///
/// Pipeline units (Note [Pipeline units]): "embedding" (wte, wpe: tokens -> B x T x n_embd),
/// one per block, "head" (ln_f and the tied wte: -> logits). A stage that holds the head but
/// not the embedding holds its own transformer.wte, initialised equal to the embedding's; the
/// pipeline sums the two copies' gradients so they stay equal (Megatron-LM does the same).
class GPT : public Model {
 public:
  explicit GPT(const GPTConfig& config, UnitRange units = {});
  torch::Tensor forward(torch::Tensor x) override;
  bool scopes_forward() const override { return true; }
  /// The blocks this instance holds: "transformer.h.0", "transformer.h.1", ...
  std::vector<std::string> block_names() const override;
  std::vector<std::string> unit_names() const override;
  bool takes_tokens() const override { return true; }
  int64_t max_sequence_length() const override { return config_.block_size; }
  /// nanoGPT's lm_head.weight, the tied transformer.wte.weight (Note [Tied embedding]).
  std::vector<PythonAlias> python_aliases() const override { return tied_aliases(); }
  /// Megatron's split (tensor_plan.h); its rules live in the model's source file.
  TensorPlan tensor_parallel_plan(int tp) const override;
  /// The learned position table, transformer.wpe.
  ContextPlan context_parallel_plan() const override {
    return {config_.n_head, "transformer.wpe", "", "", 0};
  }
  /// Its shape at block_size tokens, its blocks' kept tensors, its units' sizes.
  Workload workload() const override;
  /// What python_aliases() answers, for every GPT whatever its size.
  static std::vector<PythonAlias> tied_aliases() {
    return {{"lm_head.weight", "transformer.wte.weight"}};
  }
  const GPTConfig& config() const { return config_; }

 private:
  GPTConfig config_;
  torch::nn::Embedding wte_{nullptr}, wpe_{nullptr};
  std::vector<GPTBlock> h_;
  int64_t first_block_ = 0;  // index of h_[0] among the model's blocks
  torch::nn::LayerNorm ln_f_{nullptr};

  // forward() between the forward hooks: this instance's units in order.
  torch::Tensor run_units(torch::Tensor x);
};

}  // namespace dtorch::models
