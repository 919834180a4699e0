// The prefetching loader: batches in order whatever order workers finish them, a bounded
// number ahead, a failure raised at its own batch, and no hang on early destruction.
#include "dtorch/data/prefetch.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <random>
#include <stdexcept>

namespace dtorch::data {
namespace {

Prefetcher::Batch numbered(int64_t k) {
  return {torch::full({1}, static_cast<double>(k)), torch::full({1}, k, torch::kLong)};
}

void jitter(int64_t k) {
  std::this_thread::sleep_for(std::chrono::microseconds((k * 7919) % 3000));
}

TEST(Prefetch, DeliversInOrderWithAnyNumberOfWorkers) {
  for (int workers : {0, 1, 3, 8}) {
    Prefetcher p(40, workers, [](int64_t k) {
      jitter(k);
      return numbered(k);
    });
    for (int64_t k = 0; k < 40; ++k)
      ASSERT_EQ(p.next().second.item<int64_t>(), k) << workers << " workers";
    EXPECT_THROW(p.next(), std::out_of_range);
  }
}

TEST(Prefetch, BuildsAtMostDepthAhead) {
  std::atomic<int64_t> started{0};
  Prefetcher p(
      100, 4,
      [&](int64_t k) {
        started = std::max<int64_t>(started, k + 1);
        return numbered(k);
      },
      /*depth=*/3);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_LE(started.load(), 3);
  for (int64_t k = 0; k < 10; ++k)
    p.next();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_LE(started.load(), 13);
}

TEST(Prefetch, AFailureIsRaisedAtItsBatchAndStopsTheRest) {
  Prefetcher p(50, 3, [](int64_t k) {
    jitter(k);
    if (k == 5) throw std::runtime_error("cannot decode /data/cat/5.jpg");
    return numbered(k);
  });
  for (int64_t k = 0; k < 5; ++k)
    ASSERT_EQ(p.next().second.item<int64_t>(), k);
  try {
    p.next();
    FAIL() << "batch 5 should throw";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "cannot decode /data/cat/5.jpg");
  }
  // Asking again does not wait for batches no worker will build.
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 60; ++i) {
    try {
      p.next();
    } catch (const std::exception&) {
    }
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

TEST(Prefetch, DestroyedEarlyStopsItsWorkers) {
  std::atomic<int64_t> built{0};
  {
    Prefetcher p(1000000, 4, [&](int64_t k) {
      ++built;
      return numbered(k);
    });
    p.next();
  }
  EXPECT_LT(built.load(), 100);
}

}  // namespace
}  // namespace dtorch::data
