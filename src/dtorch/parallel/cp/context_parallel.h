// Context parallelism applied to a model by a function (PyTorch's context_parallel, Megatron's
// --context-parallel-size):
//   auto cp = dtorch::cp::parallelize(*model, mesh.cp, {dtorch::cp::Kind::Ring});
//   loss = loss_fn(model->forward(cp->shard(x)), cp->shard(y));
// Each rank of the group holds 1/n of every sequence (Note [Load-balanced chunks]); attention
// runs over the whole sequence by ring attention or Ulysses (cp/attention.h), everything else
// on the rank's tokens. Parameters stay whole on every rank: their gradients are partial sums
// over the group, which the data-parallel strategy reduces by running over dp x cp ranks.
#pragma once

#include <torch/types.h>

#include <memory>
#include <string>
#include <vector>

#include "dtorch/comm/communicator.h"
#include "dtorch/core/enum_names.h"
#include "dtorch/models/model.h"

namespace dtorch::cp {

enum class Kind {
  /// Keys and values passed around the group (Note [Ring attention]).
  Ring,
  /// Two all-to-alls between a sequence split and a head split (Note [Ulysses]).
  Ulysses,
};
/// "ring", "ulysses" (Note [Closed sets]).
const NameTable<Kind>& names(Kind);

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
  ContextParallel(std::shared_ptr<comm::Communicator> group, Options opts)
      : group_(std::move(group)), opts_(opts) {}
  ~ContextParallel();
  const std::shared_ptr<comm::Communicator>& group() const { return group_; }
  const Options& options() const { return opts_; }
  /// This rank's part of `x`'s sequence (dim 1 of token ids or targets, B x T): its head and
  /// tail chunks. ConfigError when T does not divide into 2n chunks.
  torch::Tensor shard(const torch::Tensor& x) const;

 private:
  friend std::shared_ptr<ContextParallel> parallelize(models::Model&,
                                                      std::shared_ptr<comm::Communicator>, Options);
  std::shared_ptr<comm::Communicator> group_;
  Options opts_;
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
/// position table maps the rank's local positions to the sequence's. ConfigError for a model
/// without a context-parallel plan, and for Ulysses over a group whose size does not divide the
/// heads.
std::shared_ptr<ContextParallel> parallelize(models::Model& model,
                                             std::shared_ptr<comm::Communicator> group,
                                             Options opts = {});

}  // namespace dtorch::cp
