// Note [Returning released memory]: where each policy puts a large buffer. Each test runs in
// its own process (ctest), so the process-wide policy of one does not reach the other.
#include "dtorch/core/freed_memory.h"

#include <gtest/gtest.h>
#include <malloc.h>
#include <sys/resource.h>
#include <torch/torch.h>

#include <cstdint>
#include <cstdlib>

#include "support/command.h"

namespace dtorch {
namespace {

// Bytes glibc holds in mmap'd chunks while a 16 MiB buffer is allocated, beyond those before.
// Under ASan (make test SANITIZE=1) malloc is ASan's, not glibc's: nothing here applies.
#define SKIP_UNLESS_GLIBC_MALLOC() \
  if (testing::kAddressSanitizer) GTEST_SKIP() << "malloc is AddressSanitizer's"

size_t mmapped_for_16_mib() {
  static void* volatile keep = nullptr;  // so that the compiler cannot drop malloc and free
  const size_t before = mallinfo2().hblkhd;
  keep = std::malloc(16 << 20);
  const size_t during = mallinfo2().hblkhd;
  std::free(keep);
  keep = nullptr;
  return during - before;
}

TEST(FreedMemory, ReuseServesLargeBuffersFromTheHeap) {
  SKIP_UNLESS_GLIBC_MALLOC();
  set_freed_memory(FreedMemory::Reuse);
  EXPECT_EQ(mmapped_for_16_mib(), 0u);
}

TEST(FreedMemory, ReturnMapsThemApart) {
  SKIP_UNLESS_GLIBC_MALLOC();
  set_freed_memory(FreedMemory::Return);
  EXPECT_GE(mmapped_for_16_mib(), size_t{16} << 20);
  set_freed_memory(FreedMemory::Reuse);  // training after a model was built without memory
  EXPECT_EQ(mmapped_for_16_mib(), 0u);
}

int64_t minor_faults_now() {
  rusage r{};
  getrusage(RUSAGE_SELF, &r);
  return r.ru_minflt;
}

// Two 14 MiB tensors allocated, written and freed as a training step does, round after round:
// with LibTorch's posix_memalign allocator every other round faulted all their pages again.
TEST(FreedMemory, BuffersOfAFreedSizeReuseItsPages) {
  SKIP_UNLESS_GLIBC_MALLOC();
  set_freed_memory(FreedMemory::Reuse);
  const int64_t n = (14 << 20) / 4;
  int64_t worst = 0;
  for (int round = 0; round < 6; ++round) {
    const int64_t before = minor_faults_now();
    {
      at::Tensor a = at::empty({n}), b = at::empty({n});
      a.fill_(1);
      b.fill_(2);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data_ptr()) % 64, 0u);
      EXPECT_EQ((a + b).sum().item<float>(), 3.0f * n);
    }
    if (round > 0) worst = std::max(worst, minor_faults_now() - before);
  }
  // The sum's temporary is a third buffer of the same size; the rounds after the first
  // fault at most a few pages of bookkeeping.
  EXPECT_LT(worst, 64) << "a round page-faulted " << worst << " pages (7168 per buffer)";
}

}  // namespace
}  // namespace dtorch
