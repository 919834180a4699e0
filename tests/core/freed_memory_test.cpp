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
#include "support/resident.h"

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

// Note [Kept large buffers]: a 40 MiB tensor, above what glibc ever keeps, freed and asked for
// again as every training step does (a GPT's embedding gradient): under Reuse the rounds after
// the first fault nothing in; under Return every round faults all of its pages.
int64_t worst_round_faults(int64_t elements) {
  int64_t worst = 0;
  for (int round = 0; round < 4; ++round) {
    const int64_t before = minor_faults_now();
    {
      at::Tensor a = at::empty({elements});
      a.fill_(1);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data_ptr()) % 64, 0u);
      EXPECT_EQ(a[elements - 1].item<float>(), 1.0f);
    }
    if (round > 0) worst = std::max(worst, minor_faults_now() - before);
  }
  return worst;
}

TEST(FreedMemory, LargeBuffersKeepTheirPagesUnderReuse) {
  const int64_t n = (40 << 20) / 4;  // 10240 pages
  set_freed_memory(FreedMemory::Return);
  EXPECT_GT(worst_round_faults(n), 9000) << "Return gives every large buffer back";
  set_freed_memory(FreedMemory::Reuse);
  EXPECT_LT(worst_round_faults(n), 64) << "pages of a 40 MiB buffer under Reuse";
}

// What is kept is bounded by the most held at once: buffers of ever new sizes, one at a time,
// leave at most about twice the largest mapped, and return_freed_memory gives it all back.
// Heap pages only: the code this test runs first is paged in meanwhile (Resident).
int64_t resident_bytes() {
  return testing::resident_bytes(testing::Resident::Anonymous);
}

TEST(FreedMemory, KeptLargeBuffersAreBoundedByThePeakHeld) {
  set_freed_memory(FreedMemory::Reuse);
  const int64_t before = resident_bytes();
  for (int mib = 33; mib < 64; ++mib) {
    at::Tensor a = at::empty({(int64_t{mib} << 20) / 4});
    a.fill_(1);
  }
  const int64_t after = resident_bytes();
  EXPECT_LT(after - before, int64_t{2 * 64} << 20) << "31 buffers of 33 to 63 MiB, one at a time";
  return_freed_memory();
  EXPECT_LT(resident_bytes() - before, int64_t{8} << 20) << "after return_freed_memory";
}

}  // namespace
}  // namespace dtorch
