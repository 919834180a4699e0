// Attention over a sequence split across a context-parallel group (Note [Load-balanced
// chunks]): ring attention, which passes keys and values around the group, and DeepSpeed's
// Ulysses, which trades the sequence split for a head split with two all-to-alls. Both are
// autograd functions whose backward makes the adjoint exchange.
#pragma once

#include <torch/types.h>

#include <memory>

#include "dtorch/comm/communicator.h"
#include "dtorch/models/attention.h"

namespace dtorch::cp {

using CommPtr = std::shared_ptr<comm::Communicator>;

// Note [Ring attention]
// Each rank holds the queries, keys and values of its 2 chunks. In n steps every rank's keys
// and values (packed in one buffer) pass once around the ring (rank r sends to r+1), the
// transfer of the next step's block overlapping the attention of this one. A step's attention
// is computed per (query chunk, key chunk) pair: nothing where the key chunk follows the query
// chunk, the causal triangle where they are the same chunk, the whole block where it precedes.
// Each block yields its output and the log-sum-exp of its scores, and blocks merge exactly:
// lse = log(e^lse1 + e^lse2), out = e^(lse1-lse) out1 + e^(lse2-lse) out2, in float32 (or
// float64). Backward
// walks the ring again: with the forward's output and log-sum-exp each block's probabilities
// are recomputed (flash attention's backward), the query gradient accumulates locally, and each
// key/value block's gradient travels with it, collecting every rank's contribution, and comes
// home in one last hop. Per layer and direction a rank sends (n-1)/n of the group's keys and
// values in forward, and as much again plus their gradients in backward.

/// Causal or full attention of this rank's queries over the whole sequence's keys and values.
/// qkv: 3 x B x heads x L x head_dim (L: this rank's tokens, its 2 chunks) -> B x heads x L x
/// head_dim in qkv's dtype, computed in float32 (float64 for float64 inputs). With `tokens`,
/// only the sequence's first `tokens` are keys and the rest padding (Note [Padded
/// sequences]); 0: all. Collective over `group`.
torch::Tensor ring_attention(const torch::Tensor& qkv, const CommPtr& group, bool causal,
                             int64_t tokens = 0);

// Note [Ulysses]
// An all-to-all turns the sequence split into a head split: rank j receives the j-th n-th of
// the heads for every rank's tokens, reorders those tokens into the sequence's order
// (sequence_order), runs the model's own attention kernel over the whole sequence for its
// heads, and a second all-to-all returns every rank its own tokens for all heads. Each all-to-all's
// backward is the reverse all-to-all. Bytes per layer: (n-1)/n of q, k and v and of the output, in
// each direction; heads (per tensor-parallel rank) must divide by n.

/// As ring_attention, through two all-to-alls and `kernel`. ConfigError when the heads do not
/// divide by the group's size.
torch::Tensor ulysses_attention(const torch::Tensor& qkv, const CommPtr& group, bool causal,
                                models::AttentionKernel kernel, int64_t tokens = 0);

}  // namespace dtorch::cp
