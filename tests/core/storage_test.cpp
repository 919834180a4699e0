// core/storage.h: a tensor's memory taken away and given back, and memory in mappings of its
// own that the kernel gets back when dropped (Note [Returning released memory]).
#include "dtorch/core/storage.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <string>

#include "support/command.h"

namespace dtorch {
namespace {

// This process's resident memory in KiB (VmRSS).
int64_t resident_kib() {
  std::ifstream in("/proc/self/status");
  std::string key;
  while (in >> key) {
    if (key == "VmRSS:") {
      int64_t kib = 0;
      in >> kib;
      return kib;
    }
  }
  return -1;
}

TEST(StorageMemory, MappedMemoryIsZeroAndGoesBackWhenDropped) {
  // ASan holds freed blocks in its quarantine (256 MiB): abs()'s result stays resident.
  if (testing::kAddressSanitizer) GTEST_SKIP() << "resident memory is ASan's to keep";
  const int64_t n = 16 << 20;  // 64 MiB of float
  {
    // The same operations once on a small tensor first: the code they run is paged in on first
    // use and stays resident (12 MiB of LibTorch 2.15's kernels), which is not what is measured.
    at::Tensor warm = mapped_zeros(1024, at::kFloat);
    warm.abs().max().item<float>();
    warm.fill_(1.5f);
  }
  const int64_t before = resident_kib();
  {
    at::Tensor t = mapped_zeros(n, at::kFloat);
    ASSERT_EQ(t.numel(), n);
    EXPECT_EQ(t.scalar_type(), at::kFloat);
    EXPECT_EQ(t.abs().max().item<float>(), 0.0f);
    t.fill_(1.5f);
    EXPECT_GE(resident_kib() - before, 60 << 10);
  }
  EXPECT_LE(resident_kib() - before, 4 << 10);
  at::Tensor none = mapped_zeros(0, at::kFloat);
  EXPECT_EQ(none.numel(), 0);
}

TEST(StorageMemory, ReleasedStorageTakesMappedMemoryBack) {
  at::Tensor flat = torch::arange(1024, at::kFloat);
  at::Tensor view = flat.narrow(0, 512, 512).view({16, 32});
  const size_t nbytes = flat.nbytes();
  at::DataPtr old = release_storage(flat);
  EXPECT_FALSE(holds_storage(flat));
  EXPECT_FALSE(holds_storage(view));
  EXPECT_EQ(view.sizes(), (at::IntArrayRef{16, 32}));
  restore_storage(flat, nbytes, map_memory(nbytes));
  EXPECT_TRUE(holds_storage(view));
  EXPECT_EQ(flat.abs().max().item<float>(), 0.0f);  // fresh mapping: zeros
  flat.copy_(torch::arange(1024, at::kFloat));
  EXPECT_EQ(view[0][0].item<float>(), 512.0f);  // the view sees the new memory
}

}  // namespace
}  // namespace dtorch
