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

/// Checks that a sequence of `tokens` splits over `n` context-parallel ranks; ConfigError
/// naming the length and the fix otherwise.
void check_sequence_length(int64_t tokens, int n);

}  // namespace dtorch::cp
