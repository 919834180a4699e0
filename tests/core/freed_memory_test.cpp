// Note [Returning released memory]: where each policy puts a large buffer. Each test runs in
// its own process (ctest), so the process-wide policy of one does not reach the other.
#include "dtorch/core/freed_memory.h"

#include <gtest/gtest.h>
#include <malloc.h>
#include <sys/resource.h>
#include <torch/torch.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

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

// A step that leaves more than 512 MiB free at the heap's top, as a large model's backward
// does when it releases its activations: with a 512 MiB trim threshold glibc gave that back
// to the kernel every round and the next round faulted 131k of the 196k pages in again.
TEST(FreedMemory, AStepFreeingMoreThanHalfAGibibyteKeepsItsPages) {
  SKIP_UNLESS_GLIBC_MALLOC();
  set_freed_memory(FreedMemory::Reuse);
  const size_t bytes = (size_t{16} << 20) + 72;  // a 16 MiB tensor as our CPU allocator asks
  std::vector<void*> activations;
  activations.reserve(48);  // nothing small between the buffers
  int64_t worst = 0;
  for (int round = 0; round < 3; ++round) {
    const int64_t before = minor_faults_now();
    activations.clear();
    for (int i = 0; i < 48; ++i) {
      activations.push_back(std::malloc(bytes));
      std::memset(activations.back(), i, bytes);
    }
    asm volatile("" : : "r"(activations.data()) : "memory");  // the writes happen
    for (auto it = activations.rbegin(); it != activations.rend(); ++it)
      std::free(*it);
    if (round > 0) worst = std::max(worst, minor_faults_now() - before);
  }
  EXPECT_LT(worst, 4096) << "a round page-faulted " << worst << " of 196608 pages";
}

}  // namespace
}  // namespace dtorch
