// Note [Returning released memory]: glibc's thresholds for large freed buffers.
#include "dtorch/core/freed_memory.h"

#include <malloc.h>

#include <mutex>
#include <optional>

namespace dtorch {

// Note [Returning released memory]
// A training step allocates and frees the same large buffers every time (activations,
// gradient buckets, ZeRO-3's gathered units). glibc serves an allocation above its mmap
// threshold with mmap and unmaps it on free; after such a free it raises the threshold to that
// size (up to 32 MiB) and its heap-trim threshold to twice that, so later buffers come from
// the heap, but whatever the heap frees at its top beyond the trim threshold goes back to the
// kernel all the same. Either way the next step page-faults its buffers in afresh: 15-18% of
// a one-rank mnist-cnn step was the kernel clearing and mapping pages, in dtorch as in
// PyTorch's Python.
//
// Reuse (DDP, ZeRO-1/2) fixes both thresholds high (32 MiB, the most glibc takes, and 512 MiB):
// the heap keeps what a step freed and the next step reuses it. mnist-cnn at one rank: 453-544
// samples/s before, 557-627 after, interleaved runs on one machine (PyTorch 1.13's Python:
// 463-508). RSS stays at the step's high-water mark, which it reached anyway. ZeRO-1/2 hold
// their parameters whole, so what they free each step (gradient buckets, activations) is what
// the next step needs again: gpt-small at 2 ranks (LibTorch 1.13, 4 steps), ZeRO-2 1.02
// samples/s with glibc's thresholds, 1.07-1.22 with Reuse, DDP 1.09-1.17 in the same runs;
// ZeRO-1 1.14 and 1.15-1.21; peak RSS per rank 2.15 and 2.16-2.17 GiB (ZeRO-2), 2.21 and
// 2.22-2.24 GiB (ZeRO-1).
//
// Return (ZeRO-3) sets a fixed 4 MiB mmap threshold: its gathered parameters are the memory it
// exists to save (gpt-small at 2 ranks: 2.6 GiB peak RSS per rank with it, 3.1 without), at the
// cost of the page faults.
void set_freed_memory(FreedMemory policy) {
#ifdef M_MMAP_THRESHOLD
  static std::mutex mu;
  static std::optional<FreedMemory> current;
  std::lock_guard<std::mutex> lock(mu);
  if (current == FreedMemory::Return || current == policy) return;
  current = policy;
  if (policy == FreedMemory::Return) {
    mallopt(M_MMAP_THRESHOLD, 4 << 20);
    mallopt(M_TRIM_THRESHOLD, 128 << 10);  // glibc's default
  } else {
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 512 << 20);
  }
#else
  (void)policy;
#endif
}

}  // namespace dtorch
