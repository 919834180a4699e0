// ZeRO-3's parameter shards on disk (Note [Parameters on disk]), without processes: what a slot
// is given survives its eviction and the kernel dropping its cache, an evicted slot's pages
// leave the process (its mapping's resident bytes, as /proc/self/smaps counts them), the file is
// unlinked at once, and what it needs and lacks is named. ZeRO-3 with its shards on disk
// against ZeRO-3 in memory is zero_parity_test.cpp's.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "dtorch/core/paths.h"
#include "dtorch/parallel/zero/param_offload.h"
#include "models/interop.h"
#include "support/error_of.h"

namespace dtorch::zero {
namespace {

// Bytes of the mapping holding `p` resident in this process (its Rss in /proc/self/smaps).
int64_t resident_bytes_of_mapping(const void* p) {
  std::ifstream in("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-') {
      inside = lo <= at && at < hi;
      continue;
    }
    if (inside && line.rfind("Rss:", 0) == 0) return std::stoll(line.substr(4)) * 1024;
  }
  return -1;
}

TEST(ParamOffload, ASlotKeepsWhatItIsGivenAndLeavesMemoryWhenEvicted) {
  testing::TempDir dir("param_offload");
  // Sizes that fill pages exactly, leave one partly empty, hold nothing, and span many.
  const std::vector<int64_t> numels{1024, 1500, 0, 7, 300000};
  ParamOffload po(numels, {dir.path(), 4, "params.swap"});
  EXPECT_TRUE(paths::list_directory(dir.path()).empty()) << "the file is unlinked at once";
  EXPECT_EQ(po.file_bytes(), 4096 + 8192 + 0 + 4096 + 1200128);
  torch::manual_seed(5);
  std::vector<torch::Tensor> want, slots;
  for (size_t k = 0; k < numels.size(); ++k) {
    slots.push_back(po.slot(k));
    ASSERT_EQ(slots[k].numel(), numels[k]);
    EXPECT_TRUE(slots[k].eq(0).all().item<bool>()) << "slot " << k << " starts as zeros";
    want.push_back(torch::randn({numels[k]}));
    slots[k].copy_(want[k]);
  }
  const void* big = slots[4].data_ptr();
  EXPECT_GE(resident_bytes_of_mapping(big), 1200000) << "written, the pages are in memory";
  for (size_t k = 0; k < numels.size(); ++k)
    po.evict(k);
  EXPECT_LT(resident_bytes_of_mapping(big), 64 * 1024) << "evicted, they left the process";
  for (size_t k = 0; k < numels.size(); ++k)
    EXPECT_TRUE(slots[k].equal(want[k])) << "slot " << k << " read back after eviction";
  // Changed in place (as a step changes a master), evicted with the cache dropped, read ahead.
  slots[4].mul_(2);
  po.evict_all();
  EXPECT_LT(resident_bytes_of_mapping(big), 64 * 1024);
  po.read_ahead(4);
  EXPECT_TRUE(slots[4].equal(want[4] * 2));
  // A slot outlives the ParamOffload: it holds the mapping.
  torch::Tensor kept = [&] {
    ParamOffload short_lived({16}, {dir.path(), 4, "other.swap"});
    return short_lived.slot(0).fill_(3);
  }();
  EXPECT_TRUE(kept.eq(3).all().item<bool>());
  EXPECT_TRUE(paths::list_directory(dir.path()).empty()) << "nothing left behind";
}

// A checkpoint in the background reads the shards as they were when it began, from a copy on
// disk that later steps do not reach and that goes with the last tensor read from it.
TEST(ParamOffload, ASnapshotOnDiskKeepsTheShardsAsTaken) {
  testing::TempDir dir("param_offload_snapshot");
  ParamOffload po({1500, 300000}, {dir.path(), 4, "params.swap"});
  torch::manual_seed(6);
  const torch::Tensor a = torch::randn({1500}), b = torch::randn({300000});
  po.slot(0).copy_(a);
  po.slot(1).copy_(b);
  torch::Tensor then_a, then_b;
  {
    auto copy_of = po.snapshot();
    EXPECT_FALSE(copy_of(torch::randn({4})).defined()) << "not a slot: no copy";
    then_a = copy_of(po.slot(0));
    then_b = copy_of(po.slot(1).narrow(0, 1000, 5000));  // a checkpoint's slice of a master
  }
  po.slot(0).mul_(3);
  po.slot(1).add_(1);
  po.evict_all();
  ASSERT_TRUE(then_a.defined() && then_b.defined());
  EXPECT_TRUE(then_a.equal(a));
  EXPECT_TRUE(then_b.equal(b.narrow(0, 1000, 5000)));
  EXPECT_TRUE(po.slot(0).equal(a * 3)) << "the shards themselves went on";
  EXPECT_TRUE(paths::list_directory(dir.path()).empty()) << "the copy is unlinked at once";
}

TEST(ParamOffload, WhatItNeedsAndLacksIsNamed) {
  testing::TempDir dir("param_offload_errors");
  std::string e = testing::error_of([&] {
    ParamOffload po({16}, {dir.path() + "/absent", 4, "params.swap"});
  });
  EXPECT_NE(e.find("the offload folder " + dir.path() + "/absent does not exist"),
            std::string::npos)
      << e;
  // 2^40 floats: 4 TiB of shards that no test machine's disk holds.
  e = testing::error_of([&] { ParamOffload po({int64_t{1} << 40}, {dir.path(), 4, "p.swap"}); });
  EXPECT_NE(e.find("this rank's share of the parameters needs 4398046511104"), std::string::npos)
      << e;
  EXPECT_TRUE(paths::list_directory(dir.path()).empty()) << "nothing left behind";
}

}  // namespace
}  // namespace dtorch::zero
