// Tensor parallelism applied to a model by a function (PyTorch's parallelize_module):
//   auto tp = dtorch::tp::parallelize(*model, mesh.tp, dtorch::tp::plan_for(*model, 2));
// Each rank keeps only its shard of every split parameter; forward and backward exchange
// activations within the tp group (Note [Tensor-parallel regions]). Data parallelism (DDP,
// ZeRO-1/2) then goes on top over the dp group.
#pragma once

#include <torch/ordered_dict.h>
#include <torch/types.h>

#include <map>
#include <memory>
#include <string>

#include "dtorch/comm/communicator.h"
#include "dtorch/models/model.h"
#include "dtorch/parallel/tp/plan.h"

namespace dtorch::tp {

struct Options {
  /// Megatron's sequence parallelism: outside the attention and MLP regions (norms,
  /// residuals) each rank holds 1/tp of the sequence, and every allreduce becomes a
  /// reduce-scatter plus an allgather. The sequence length must divide by tp.
  bool sequence_parallel = false;
};

/// How one parameter is split: along `dim`, in `fused` equal parts each split tp ways
/// (rank r holds part f's r-th slice for every f, concatenated).
struct ShardSpec {
  int64_t dim = 0;
  int64_t fused = 1;
};

/// Rank r's slice of `full` under `spec` over n ranks, and the inverse (one shard per rank).
torch::Tensor shard_of(const torch::Tensor& full, const ShardSpec& spec, int r, int n);
torch::Tensor unshard(const std::vector<torch::Tensor>& shards, const ShardSpec& spec);

/// The handle parallelize() returns; keep it alive while the model trains (it owns the
/// hooks' group).
class TensorParallel {
 public:
  TensorParallel(std::shared_ptr<comm::Communicator> tp, Options opts)
      : tp_(std::move(tp)), opts_(opts) {}
  ~TensorParallel();
  const std::shared_ptr<comm::Communicator>& group() const { return tp_; }
  const Options& options() const { return opts_; }
  /// Split parameters by state_dict name; the rest are replicated on every tp rank.
  const std::map<std::string, ShardSpec>& sharded() const { return sharded_; }
  /// Replicated parameters whose gradients are partial sums over the tp group (used on a
  /// slice of the sequence under sequence parallelism) and are all-reduced in backward.
  const std::vector<std::string>& partial_gradients() const { return partial_; }

  /// Whether the model's output is this rank's slice of the vocabulary (GPT's tied head):
  /// then the loss must be vocab_cross_entropy().
  bool vocab_parallel_output() const { return vocab_output_; }
  /// Cross-entropy of vocabulary-sliced logits (B x T x V/tp) against token ids, without
  /// any rank holding the full logits (Megatron's vocab_parallel_cross_entropy): the mean
  /// over tokens, equal on every tp rank.
  torch::Tensor vocab_cross_entropy(const torch::Tensor& logits, const torch::Tensor& target) const;
  /// How many targets are the argmax of their vocabulary-sliced logits (ties count as hits),
  /// equal on every tp rank. Collective over the group.
  int64_t vocab_correct(const torch::Tensor& logits, const torch::Tensor& target) const;

  /// The model's full parameters and buffers by state_dict name, split ones gathered from
  /// every tp rank (a collective over the group: every tp rank calls it).
  torch::OrderedDict<std::string, torch::Tensor> full_state_dict(torch::nn::Module& model) const;
  /// Copies the split `model`'s parameters and buffers, gathered whole, into `full` (the same
  /// model unsplit). Collective over the group.
  void load_into(torch::nn::Module& full, torch::nn::Module& model) const;
  /// The inverse: copies `full`'s parameters and buffers into the split `model`, this rank's
  /// shard of split ones, the whole of the rest (by state_dict name). Names the first missing
  /// or misshapen entry. Local.
  void load_from(torch::nn::Module& model, torch::nn::Module& full) const;

 private:
  friend std::shared_ptr<TensorParallel> parallelize(models::Model&,
                                                     std::shared_ptr<comm::Communicator>,
                                                     const Plan&, Options);
  std::shared_ptr<comm::Communicator> tp_;
  Options opts_;
  std::map<std::string, ShardSpec> sharded_;
  std::vector<std::string> partial_;
  std::vector<torch::nn::Module*> hooked_;
  int64_t vocab_rows_ = 0;     // rows of the vocabulary-split embedding on this rank
  int64_t vocab_start_ = 0;    // the first of them
  bool vocab_output_ = false;  // the tied head gives vocabulary-sliced logits
};

/// Splits `model` across `tp` as `plan` says: shards parameters in place (each rank keeps
/// its slices only) and installs the module hooks (Note [Module hooks]) that move
/// activations between regions. Every rank of the group builds the same model first (same
/// seed) and calls this with the same plan. Throws ConfigError naming a rule that matches no
/// module, a style that does not fit its module, or a size tp does not divide.
std::shared_ptr<TensorParallel> parallelize(models::Model& model,
                                            std::shared_ptr<comm::Communicator> tp,
                                            const Plan& plan, Options opts = {});

}  // namespace dtorch::tp
