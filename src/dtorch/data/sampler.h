// Which samples each rank sees: a DistributedSampler for training (same shuffle on every rank,
// equal counts so DDP ranks take the same number of steps) and an exact sharding for evaluation.
#pragma once

#include <cstdint>
#include <vector>

namespace dtorch::data {

/// Note [Sampler order]: the epoch's permutation is torch.randperm(num_samples) drawn from a
/// CPU generator seeded with seed + epoch, padded by wrapping around to a multiple of world,
/// and rank r takes positions r, r + world, r + 2 world, ... This is exactly what PyTorch's
/// torch.utils.data.DistributedSampler (drop_last=False) does, so a C++ and a Python run with
/// the same seed visit the same samples, and every rank computes the same permutation
/// without communicating.
class DistributedSampler {
 public:
  /// `num_samples` in the dataset, this process's `rank` of `world`; `shuffle` false keeps
  /// dataset order (still padded and strided). Throws ConfigError on a bad rank/world.
  DistributedSampler(int64_t num_samples, int rank, int world, uint64_t seed = 0,
                     bool shuffle = true);

  /// Selects the epoch whose permutation indices() returns; call it before each epoch, or
  /// every epoch repeats the same order.
  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }

  /// This rank's sample indices for the current epoch, in visiting order:
  /// samples_per_rank() of them, the same count on every rank.
  std::vector<int64_t> indices() const;

  /// ceil(num_samples / world): the indices each rank gets per epoch, padding included.
  int64_t samples_per_rank() const;
  int64_t num_samples() const { return num_samples_; }

 private:
  int64_t num_samples_;
  int rank_;
  int world_;
  uint64_t seed_;
  bool shuffle_;
  int64_t epoch_ = 0;
};

/// The whole epoch order every rank agrees on (before padding): a permutation of
/// 0..num_samples-1 from (seed, epoch), see Note [Sampler order].
std::vector<int64_t> epoch_permutation(int64_t num_samples, uint64_t seed, int64_t epoch);

/// Half-open range [begin, end) of sample indices.
struct IndexRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

/// Evaluation sharding: rank's contiguous, unpadded share of num_samples. The ranges of
/// ranks 0..world-1 are disjoint, in order, cover every sample exactly once and differ in
/// size by at most one, so metrics summed over ranks count each sample once.
IndexRange eval_shard(int64_t num_samples, int rank, int world);

/// Cuts `indices` into consecutive batches of `batch_size`; the last, shorter batch is kept
/// unless `drop_last`. Throws ConfigError when batch_size < 1.
std::vector<std::vector<int64_t>> make_batches(const std::vector<int64_t>& indices,
                                               int64_t batch_size, bool drop_last = false);

/// How many batches make_batches gives for `count` indices.
int64_t num_batches(int64_t count, int64_t batch_size, bool drop_last = false);

}  // namespace dtorch::data
