// Note [Load-balanced chunks]: the layout and the index maps that follow it.
#include "dtorch/parallel/cp/sequence_chunks.h"

#include "dtorch/core/error.h"

namespace dtorch::cp {

std::array<int64_t, 2> chunks_of(int rank, int n) {
  DTORCH_CHECK(n >= 1 && rank >= 0 && rank < n, "rank ", rank, " of ", n);
  return {rank, 2 * int64_t(n) - 1 - rank};
}

void check_sequence_length(int64_t tokens, int n) {
  DTORCH_CHECK_T(ConfigError, tokens % (2 * int64_t(n)) == 0, "context parallelism over ", n,
                 " ranks cuts each sequence into ", 2 * n,
                 " equal chunks (a head and a tail per rank), and a sequence of ", tokens,
                 " tokens does not divide: use a sequence length (--seq-len) that is a multiple "
                 "of ",
                 2 * n);
}

int64_t padded_length(int64_t tokens, int n) {
  const int64_t chunks = 2 * int64_t(n);
  return (tokens + chunks - 1) / chunks * chunks;
}

torch::Tensor shard_sequence(const torch::Tensor& x, int64_t dim, int rank, int n) {
  if (n == 1) return x;
  check_sequence_length(x.size(dim), n);
  const int64_t c = x.size(dim) / (2 * n);
  const auto [head, tail] = chunks_of(rank, n);
  return torch::cat({x.narrow(dim, head * c, c), x.narrow(dim, tail * c, c)}, dim);
}

torch::Tensor unshard_sequence(const std::vector<torch::Tensor>& parts, int64_t dim) {
  const int n = static_cast<int>(parts.size());
  const int64_t c = parts.at(0).size(dim) / 2;
  std::vector<torch::Tensor> chunks(2 * n);
  for (int r = 0; r < n; ++r) {
    const auto [head, tail] = chunks_of(r, n);
    chunks[head] = parts[r].narrow(dim, 0, c);
    chunks[tail] = parts[r].narrow(dim, c, c);
  }
  return torch::cat(chunks, dim);
}

torch::Tensor global_positions(int64_t local, int rank, int n, const torch::Device& device) {
  const int64_t c = local / 2;
  const auto [head, tail] = chunks_of(rank, n);
  auto opts = torch::TensorOptions().dtype(torch::kLong).device(device);
  return torch::cat(
      {torch::arange(head * c, head * c + c, opts), torch::arange(tail * c, tail * c + c, opts)});
}

torch::Tensor sequence_order(int64_t local, int n, const torch::Device& device) {
  const int64_t c = local / 2;
  std::vector<int64_t> order(2 * n * c);
  for (int r = 0; r < n; ++r) {
    const auto chunks = chunks_of(r, n);
    for (int half = 0; half < 2; ++half)
      for (int64_t i = 0; i < c; ++i)
        order[chunks[half] * c + i] = r * local + half * c + i;
  }
  return torch::tensor(order, torch::kLong).to(device);
}

}  // namespace dtorch::cp
