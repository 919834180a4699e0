// The loader that prepares the next batches while the current one trains: worker threads
// build batches ahead, in any order, and hand them out strictly in order.
#pragma once

#include <torch/types.h>

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace dtorch::data {

/// Note [Prefetching loader]: PyTorch's DataLoader forks worker processes because Python's
/// decoding holds the GIL; C++ decodes in parallel in threads of one process, sharing the
/// dataset's memory (CIFAR-10's array, a folder's file list) instead of copying it per
/// worker. Each worker builds whole batches (as a DataLoader worker does), so `workers`
/// means what num_workers means. At most `depth` batches are built but not yet taken, which
/// bounds the memory. A batch whose building threw rethrows from next() at its turn: the
/// training loop sees the error of the batch it asked for, with its file name, and the other
/// workers stop; nothing waits forever on a batch that failed. The destructor stops the
/// workers and joins them (a batch being built is finished first).
class Prefetcher {
 public:
  using Batch = std::pair<torch::Tensor, torch::Tensor>;
  /// make(k) builds batch k of `count`; it must be safe to call from several threads.
  /// workers 0: next() calls make itself, nothing runs ahead. depth 0: 2 x workers.
  Prefetcher(int64_t count, int workers, std::function<Batch(int64_t)> make, int64_t depth = 0);
  ~Prefetcher();
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  /// Batch 0, then 1, ...: waits for it if a worker is still building it. Throws what
  /// building it threw; std::out_of_range past the last.
  Batch next();

 private:
  void work();

  const int64_t count_;
  const int64_t depth_;
  const std::function<Batch(int64_t)> make_;
  std::mutex mutex_;
  std::condition_variable changed_;
  int64_t claimed_ = 0;  // batches a worker has started
  int64_t taken_ = 0;    // batches next() has returned
  bool stopping_ = false;
  std::map<int64_t, std::pair<Batch, std::exception_ptr>> ready_;
  std::vector<std::thread> workers_;
};

}  // namespace dtorch::data
