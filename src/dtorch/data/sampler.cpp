// Distributed sampling as pure functions of (num_samples, rank, world, seed, epoch): no state
// is shared between ranks, so agreement comes from computing the same thing everywhere.
#include "dtorch/data/sampler.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>

#include "dtorch/core/error.h"

namespace dtorch::data {

DistributedSampler::DistributedSampler(int64_t num_samples, int rank, int world, uint64_t seed,
                                       bool shuffle)
    : num_samples_(num_samples), rank_(rank), world_(world), seed_(seed), shuffle_(shuffle) {
  DTORCH_CHECK_T(ConfigError, num_samples >= 0, "DistributedSampler: num_samples is ", num_samples,
                 ", must be >= 0");
  DTORCH_CHECK_T(ConfigError, world >= 1 && rank >= 0 && rank < world, "DistributedSampler: rank ",
                 rank, " of world ", world,
                 " is out of range (need 0 <= rank < world); check RANK and WORLD_SIZE");
}

int64_t DistributedSampler::samples_per_rank() const {
  return (num_samples_ + world_ - 1) / world_;
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> order;
  if (shuffle_) {
    order = epoch_permutation(num_samples_, seed_, epoch_);
  } else {
    order.resize(num_samples_);
    for (int64_t i = 0; i < num_samples_; ++i)
      order[i] = i;
  }
  std::vector<int64_t> mine;
  if (num_samples_ == 0) return mine;
  const int64_t total = samples_per_rank() * world_;
  mine.reserve(samples_per_rank());
  // Positions past the end wrap around to the start of the permutation (padding).
  for (int64_t pos = rank_; pos < total; pos += world_)
    mine.push_back(order[pos % num_samples_]);
  return mine;
}

std::vector<int64_t> epoch_permutation(int64_t num_samples, uint64_t seed, int64_t epoch) {
  // A private generator, not the global one: the order must not depend on what else drew
  // random numbers in this process (model init, dropout), only on (seed, epoch).
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed + static_cast<uint64_t>(epoch));
  // randperm takes the generator's mutex itself; no lock here (it would deadlock).
  torch::Tensor perm = at::randperm(num_samples, gen, torch::kInt64);
  const int64_t* p = perm.data_ptr<int64_t>();
  return std::vector<int64_t>(p, p + num_samples);
}

IndexRange eval_shard(int64_t num_samples, int rank, int world) {
  DTORCH_CHECK_T(ConfigError, world >= 1 && rank >= 0 && rank < world, "eval_shard: rank ", rank,
                 " of world ", world, " is out of range (need 0 <= rank < world)");
  DTORCH_CHECK_T(ConfigError, num_samples >= 0, "eval_shard: num_samples is ", num_samples);
  // floor(n * r / world) boundaries: sizes differ by at most one and sum to n.
  return {num_samples * rank / world, num_samples * (rank + 1) / world};
}

int64_t num_batches(int64_t count, int64_t batch_size, bool drop_last) {
  DTORCH_CHECK_T(ConfigError, batch_size >= 1, "batch size is ", batch_size, ", must be >= 1");
  return drop_last ? count / batch_size : (count + batch_size - 1) / batch_size;
}

std::vector<std::vector<int64_t>> make_batches(const std::vector<int64_t>& indices,
                                               int64_t batch_size, bool drop_last) {
  const int64_t n = num_batches(static_cast<int64_t>(indices.size()), batch_size, drop_last);
  std::vector<std::vector<int64_t>> out;
  out.reserve(n);
  for (int64_t b = 0; b < n; ++b) {
    auto first = indices.begin() + b * batch_size;
    auto last = indices.begin() + std::min<int64_t>((b + 1) * batch_size, indices.size());
    out.emplace_back(first, last);
  }
  return out;
}

}  // namespace dtorch::data
