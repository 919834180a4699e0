// Note [Returning released memory]: glibc's thresholds for large freed buffers.
#include "dtorch/core/freed_memory.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/alignment.h>
#include <malloc.h>

#include <cstdint>
#include <cstdlib>
#include <mutex>

#include "dtorch/core/torch_compat.h"

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
// Reuse (DDP, ZeRO-1/2) fixes the mmap threshold at 32 MiB, the most glibc takes, and turns
// heap trimming off: the heap keeps what a step freed and the next step reuses it. mnist-cnn at one
// rank: 453-544 samples/s before, 557-627 after, interleaved runs on one machine (PyTorch 1.13's
// Python: 463-508). RSS stays at the step's high-water mark, which it reached anyway. ZeRO-1/2 hold
// their parameters whole, so what they free each step (gradient buckets, activations) is what
// the next step needs again: gpt-small at 2 ranks (LibTorch 1.13, 4 steps), ZeRO-2 1.02
// samples/s with glibc's thresholds, 1.07-1.22 with Reuse, DDP 1.09-1.17 in the same runs;
// ZeRO-1 1.14 and 1.15-1.21; peak RSS per rank 2.15 and 2.16-2.17 GiB (ZeRO-2), 2.21 and
// 2.22-2.24 GiB (ZeRO-1).
//
// Trimming is off, not merely high. With a trim threshold of 512 MiB, a step that left more
// than that free at the heap's top (a large model's activations, released in backward) gave it
// back to the kernel and faulted it in again the next step: 48 buffers of 16 MiB malloc'ed,
// written and freed last first fault 131k of their 196k pages every round under 512 MiB, none
// with trimming off. gpt-large under tp 2 at 2 ranks (LibTorch 2.15, 1 thread per rank, the
// median of 3 steps of dtorch bench memory): 13.5 s a step under 512 MiB, 5.6 and 6.6 s in two
// runs with trimming off; 487k and 200k page faults a step; peak RSS 7.9 GiB per rank in both.
// return_freed_memory (malloc_trim) still gives the heap back when asked.
//
// That was not all. LibTorch's own CPU allocator asks for 64-byte aligned memory
// (posix_memalign), and glibc serves an aligned request by taking alignment + a minimum chunk
// more than asked and trimming the ends: a freed buffer is then always a little too small for
// the next request of the same size, which comes from fresh heap instead, and the heap's top
// is trimmed and grown again. Two 14 MiB buffers allocated and freed in a loop under Reuse's
// thresholds fault 7168 of their 7168 pages every other round with posix_memalign, none with
// malloc. So set_freed_memory also installs ExactReuseAllocator as LibTorch's CPU allocator:
// plain malloc, the alignment done by hand, so a buffer of a size freed before gets that
// memory back. gpt-small at 2 ranks (LibTorch 2.15, 4 steps, interleaved runs): DDP 142k page
// faults a step with LibTorch's allocator and 114k with this one; ZeRO-3 405k and 193k, and
// 0.61-0.66 samples/s against 0.82-0.86 (DDP 0.74-0.82 in the same runs); peak RSS per rank
// 2.26 and 2.31 GiB. What still faults is buffers above the 32 MiB glibc always maps apart (a
// GPT's token-embedding gradients, the root unit's).
//
// ZeRO-3 uses Reuse too: what it must give back when released, its gathered units and its
// gradient buckets, lives in mappings of its own (map_memory in core/storage.h), unmapped
// whatever glibc's thresholds. It used to set Return, a fixed 4 MiB mmap threshold, which also
// made every buffer above 4 MiB fault afresh each step: with the allocator above, 350k faults
// a step and 0.63 samples/s under Return, 2.23 GiB peak RSS.
//
// Return remains for building a model without memory (Note [Deferred initialisation]): each
// released unit would otherwise stay in the heap below the next one's, and the skeleton of
// gpt-large held 1.5 GiB of freed memory.
namespace {

// Note [Returning released memory]: LibTorch's own CPU allocator, with plain malloc under it.
// Each block is malloc'ed gAlignment + one pointer larger, and the pointer malloc returned is
// kept just below the aligned data, so the data is its own context (raw_allocate works).
class ExactReuseAllocator final : public compat::Allocator {
 public:
  at::DataPtr allocate_bytes(size_t nbytes) const override {
    if (nbytes == 0) return {nullptr, nullptr, &release, at::kCPU};
    void* block = std::malloc(nbytes + c10::gAlignment + sizeof(void*));
    if (!block) c10::profiledCPUMemoryReporter().OutOfMemory(nbytes);
    TORCH_CHECK(block, "dtorch CPU allocator: can't allocate memory: you tried to allocate ",
                nbytes, " bytes");
    const auto at = (reinterpret_cast<uintptr_t>(block) + sizeof(void*) + c10::gAlignment - 1) &
                    ~uintptr_t(c10::gAlignment - 1);
    void* data = reinterpret_cast<void*>(at);
    static_cast<void**>(data)[-1] = block;
    c10::profiledCPUMemoryReporter().New(data, nbytes);  // what the allocation meter reads
    return {data, data, &release, at::kCPU};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }

 private:
  static void release(void* data) {
    if (!data) return;
    c10::profiledCPUMemoryReporter().Delete(data);
    std::free(static_cast<void**>(data)[-1]);
  }
};

}  // namespace

void set_freed_memory(FreedMemory policy) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  static ExactReuseAllocator* allocator = nullptr;
  if (!allocator) {
    allocator = new ExactReuseAllocator();  // never destroyed: in use until the process exits
    c10::SetCPUAllocator(allocator);
  }
#ifdef M_MMAP_THRESHOLD
  if (policy == FreedMemory::Return) {
    mallopt(M_MMAP_THRESHOLD, 4 << 20);
    mallopt(M_TRIM_THRESHOLD, 128 << 10);  // glibc's default
  } else {
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, -1);  // never: a step can free more than any fixed size
  }
#else
  (void)policy;
#endif
}

void return_freed_memory() {
#ifdef M_MMAP_THRESHOLD
  malloc_trim(0);
#endif
}

}  // namespace dtorch
