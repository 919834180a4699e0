// Which tokens of a sequence each context-parallel rank holds: a pure layout, tested without
// processes, that ring attention, Ulysses, the position ids and the batch's split all follow.
#pragma once

#include <torch/types.h>

#include <array>
#include <cstdint>
#include <vector>

namespace dtorch::cp {

// Note [Load-balanced chunks]
// Under causal attention token t attends to t + 1 tokens, so n contiguous slices would give
// the last rank n times the first one's work, and the whole group would wait for it. Each
// sequence is cut into 2n equal chunks instead, and rank r holds chunk r (its head) and chunk
// 2n-1-r (its tail), in that order: the pairs (0, 2n-1), (1, 2n-2), ... each hold the same
// number of (query, key) pairs below the diagonal, so every ring step costs every rank the same
// (torchtitan's and Megatron-Core's causal load balancing). Everything outside attention works
// on the rank's 2 chunks as one local sequence; only attention and the position ids need to
// know where the chunks lie.

// Note [Padded sequences]
// A model that makes its sequence inside (vit: a class token and the patches, 17 tokens for
// vit-debug) has a length its input fixes, which need not divide into 2n chunks. It is padded
// at the end to the next multiple of 2n (padded_length) before it is split, and gathered whole
// and cut back after the last block. The padding is a suffix of the sequence, so it is a suffix
// of every block of keys ring attention takes (a key chunk's, or a head chunk's then a tail
// chunk's): those columns are masked, and a block of padding only is skipped; Ulysses attends
// over the real prefix alone. Padded queries' outputs are never read, so their gradients are
// zero and they change nothing; the cost is at most 2n-1 tokens of work per sequence.

/// The two chunks (of 2n) that rank r holds, head first.
std::array<int64_t, 2> chunks_of(int rank, int n);

/// Rank r's part of `x` along `dim`: its head and tail chunks, concatenated. ConfigError when
/// the length is not a multiple of 2n.
torch::Tensor shard_sequence(const torch::Tensor& x, int64_t dim, int rank, int n);

/// The inverse: the whole sequence from every rank's part, given in rank order.
torch::Tensor unshard_sequence(const std::vector<torch::Tensor>& parts, int64_t dim);

/// The positions in the whole sequence of rank r's `local` tokens (int64, on `device`).
torch::Tensor global_positions(int64_t local, int rank, int n, const torch::Device& device);

/// The ranks' parts concatenated in rank order (n parts of `local` tokens), reordered into
/// the sequence's order: index_select with this (int64, on `device`) does it.
torch::Tensor sequence_order(int64_t local, int n, const torch::Device& device);

/// `tokens` rounded up to a multiple of 2n (Note [Padded sequences]).
int64_t padded_length(int64_t tokens, int n);

/// Checks that a sequence of `tokens` splits over `n` context-parallel ranks; ConfigError
/// naming the length and the fix otherwise.
void check_sequence_length(int64_t tokens, int n);

}  // namespace dtorch::cp
