// Context parallelism applied to a model by a function (PyTorch's context_parallel, Megatron's
// --context-parallel-size):
//   auto cp = dtorch::cp::parallelize(*model, mesh.cp, {dtorch::cp::Kind::Ring});
//   loss = loss_fn(model->forward(cp->shard(x)), cp->shard(y));
// Each rank of the group holds 1/n of every sequence (Note [Load-balanced chunks]); attention
// runs over the whole sequence by ring attention or Ulysses (cp/attention.h), everything else
// on the rank's tokens. A model whose input is not its sequence (vit) splits it inside and
// gathers it again before its head (Note [Padded sequences]); shard() leaves its batches whole.
// Parameters stay whole on every rank: their gradients are partial sums over the group, which the
// data-parallel strategy reduces by running over dp x cp ranks.
#pragma once

#include <torch/types.h>

#include <memory>
#include <string>
#include <vector>

#include "dtorch/comm/communicator.h"
#include "dtorch/core/enum_names.h"
#include "dtorch/models/model.h"
#include "dtorch/parallel/cp/kind.h"

namespace dtorch::cp {

struct Options {
  Kind kind = Kind::Ring;
  /// The tensor-parallel degree the model is split over as well: Ulysses splits each tensor-
  /// parallel rank's heads (n_head / tp) further.
  int tp = 1;
};

/// The handle parallelize() returns; keep it alive while the model trains (it owns the hooks'
/// group).
class ContextParallel {
 public:
  ContextParallel(std::shared_ptr<comm::Communicator> group, Options opts,
                  models::Model::ContextPlan plan)
      : group_(std::move(group)), opts_(opts), plan_(std::move(plan)) {}
  ~ContextParallel();
  const std::shared_ptr<comm::Communicator>& group() const { return group_; }
  const Options& options() const { return opts_; }
  /// This rank's part of a batch's inputs or targets: for a model whose input is the sequence
  /// (B x T token ids), its head and tail chunks of dim 1 (ConfigError when T does not divide
  /// into 2n chunks); for one that splits its sequence inside, `x` whole.
  torch::Tensor shard(const torch::Tensor& x) const;
  /// The tokens this rank holds of a sequence of `input_tokens` (or of the model's own
  /// sequence, padded).
  int64_t local_length(int64_t input_tokens) const;

 private:
  friend std::shared_ptr<ContextParallel> parallelize(models::Model&,
                                                      std::shared_ptr<comm::Communicator>, Options);
  std::shared_ptr<comm::Communicator> group_;
  Options opts_;
  models::Model::ContextPlan plan_;
  std::vector<torch::nn::Module*> hooked_;
};

/// Bytes one rank sends per attention layer in a training step (forward and backward), as Note
/// [Ring attention] and Note [Ulysses] count them, over `n` ranks, for `batch` sequences of
/// `local_tokens` on the rank, `heads` (on the rank, after any tensor-parallel split) of
/// `head_dim`, activations of `element_bytes`: ring, (n-1) passes of the rank's keys and
/// values in forward and in backward plus n of their float32 gradients; Ulysses, (n-1)/n of
/// q, k, v and of the output, each way.
struct LayerBytes {
  int64_t forward = 0, backward = 0;
};
LayerBytes bytes_sent_per_layer(Kind kind, int n, int64_t batch, int64_t heads,
                                int64_t local_tokens, int64_t head_dim, int64_t element_bytes);

/// Installs the module hooks (Note [Module hooks]) that make `model` context-parallel over
/// `group`: every attention core (Note [Attention core]) runs as opts.kind says, and the
/// position table maps the rank's local positions to the sequence's, or the modules the
/// model's plan names split and gather its sequence. ConfigError for a model
/// without a context-parallel plan, and for Ulysses over a group whose size does not divide the
/// heads.
std::shared_ptr<ContextParallel> parallelize(models::Model& model,
                                             std::shared_ptr<comm::Communicator> group,
                                             Options opts = {});

}  // namespace dtorch::cp
