// Bucket planning: reverse order, caps, dtype separation (Note [Bucket order]).
#include "dtorch/parallel/ddp/bucket_plan.h"

#include <gtest/gtest.h>

#include "dtorch/core/error.h"

namespace dtorch::ddp {
namespace {

ParamSpec f32(int64_t n) {
  return {n, c10::ScalarType::Float, c10::Device(c10::kCPU)};
}

TEST(DdpBucketPlan, ReverseOrderAndSmallFirstBucket) {
  // 4 params of 100 floats (400 B); first cap 400 B, later cap 1200 B.
  auto plan = plan_buckets({f32(100), f32(100), f32(100), f32(100)}, 400, 1200);
  ASSERT_EQ(plan.buckets.size(), 2u);
  EXPECT_EQ(plan.buckets[0].params, (std::vector<size_t>{3}));
  EXPECT_EQ(plan.buckets[1].params, (std::vector<size_t>{2, 1, 0}));
  EXPECT_EQ(plan.buckets[1].offsets, (std::vector<int64_t>{0, 100, 200}));
  EXPECT_EQ(plan.buckets[1].numel, 300);
  EXPECT_EQ(plan.where[0], (std::pair<size_t, size_t>{1, 2}));
  EXPECT_EQ(plan.where[3], (std::pair<size_t, size_t>{0, 0}));
}

TEST(DdpBucketPlan, LargeParameterGetsOwnBucket) {
  auto plan = plan_buckets({f32(10), f32(10000), f32(10)}, 100, 100);
  ASSERT_EQ(plan.buckets.size(), 2u);
  EXPECT_EQ(plan.buckets[0].params, (std::vector<size_t>{2, 1}));  // closes once >= cap
  EXPECT_EQ(plan.buckets[1].params, (std::vector<size_t>{0}));
}

TEST(DdpBucketPlan, DtypesNeverShareABucket) {
  ParamSpec h{50, c10::ScalarType::Half, c10::Device(c10::kCPU)};
  auto plan = plan_buckets({f32(10), h, f32(10), h}, 1 << 20, 1 << 20);
  ASSERT_EQ(plan.buckets.size(), 2u);
  for (const auto& b : plan.buckets) {
    for (size_t i : b.params) {
      EXPECT_EQ(b.dtype, i % 2 ? c10::ScalarType::Half : c10::ScalarType::Float);
    }
  }
}

TEST(DdpBucketPlan, EveryParameterPlacedOnce) {
  std::vector<ParamSpec> ps;
  for (int i = 0; i < 37; ++i)
    ps.push_back(f32(1 + i * 13));
  auto plan = plan_buckets(ps, 64, 1000);
  std::vector<int> seen(ps.size(), 0);
  for (size_t b = 0; b < plan.buckets.size(); ++b) {
    const auto& bk = plan.buckets[b];
    int64_t off = 0;
    for (size_t j = 0; j < bk.params.size(); ++j) {
      ++seen[bk.params[j]];
      EXPECT_EQ(bk.offsets[j], off);
      EXPECT_EQ(plan.where[bk.params[j]], (std::pair<size_t, size_t>{b, j}));
      off += ps[bk.params[j]].numel;
    }
    EXPECT_EQ(bk.numel, off);
  }
  for (int s : seen)
    EXPECT_EQ(s, 1);
}

TEST(DdpBucketPlan, RejectsZeroCapacity) {
  EXPECT_THROW(plan_buckets({f32(1)}, 0, 10), ConfigError);
}

}  // namespace
}  // namespace dtorch::ddp
