// Note [Returning released memory]: where each policy puts a large buffer. Each test runs in
// its own process (ctest), so the process-wide policy of one does not reach the other.
#include "dtorch/core/freed_memory.h"

#include <gtest/gtest.h>
#include <malloc.h>

#include <cstdlib>

namespace dtorch {
namespace {

// Bytes glibc holds in mmap'd chunks while a 16 MiB buffer is allocated, beyond those before.
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
  set_freed_memory(FreedMemory::Reuse);
  EXPECT_EQ(mmapped_for_16_mib(), 0u);
}

TEST(FreedMemory, ReturnMapsThemApartAndStaysOnceSet) {
  set_freed_memory(FreedMemory::Return);
  set_freed_memory(FreedMemory::Reuse);  // a ZeRO-3 model in the process: memory first
  EXPECT_GE(mmapped_for_16_mib(), size_t{16} << 20);
}

}  // namespace
}  // namespace dtorch
