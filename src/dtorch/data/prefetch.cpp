// Note [Prefetching loader] is in prefetch.h.
#include "dtorch/data/prefetch.h"

#include <stdexcept>

namespace dtorch::data {

Prefetcher::Prefetcher(int64_t count, int workers, std::function<Batch(int64_t)> make,
                       int64_t depth)
    : count_(count), depth_(depth > 0 ? depth : 2 * workers), make_(std::move(make)) {
  for (int w = 0; w < workers; ++w)
    workers_.emplace_back([this] { work(); });
}

Prefetcher::~Prefetcher() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  for (auto& t : workers_)
    t.join();
}

void Prefetcher::work() {
  for (;;) {
    int64_t k = 0;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock,
                    [&] { return stopping_ || (claimed_ < count_ && claimed_ < taken_ + depth_); });
      if (stopping_) return;
      k = claimed_++;
    }
    std::pair<Batch, std::exception_ptr> done;
    try {
      done.first = make_(k);
    } catch (...) {
      done.second = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (done.second) stopping_ = true;  // later batches are not needed
      ready_.emplace(k, std::move(done));
    }
    changed_.notify_all();
  }
}

Prefetcher::Batch Prefetcher::next() {
  if (taken_ >= count_) throw std::out_of_range("Prefetcher::next past the last batch");
  if (workers_.empty()) return make_(taken_++);
  std::unique_lock<std::mutex> lock(mutex_);
  // Every claimed batch is put in ready_, failed or not; after a failure nothing more is
  // claimed, and asking past it is an error rather than a wait.
  changed_.wait(lock, [&] { return ready_.count(taken_) || (stopping_ && taken_ >= claimed_); });
  if (!ready_.count(taken_))
    throw std::runtime_error("the data loader stopped after an earlier batch failed to load");
  auto it = ready_.find(taken_);
  auto [batch, error] = std::move(it->second);
  ready_.erase(it);
  ++taken_;
  lock.unlock();
  changed_.notify_all();
  if (error) std::rethrow_exception(error);
  return batch;
}

}  // namespace dtorch::data
