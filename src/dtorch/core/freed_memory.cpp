// Note [Returning released memory]: glibc's thresholds for large freed buffers.
#include "dtorch/core/freed_memory.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/alignment.h>
#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <utility>
#include <vector>

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
// Buffers above 32 MiB are the allocator's own (Note [Kept large buffers]).
//
// Return remains for building a model without memory (Note [Deferred initialisation]): each
// released unit would otherwise stay in the heap below the next one's, and the skeleton of
// gpt-large held 1.5 GiB of freed memory.
// Note [Kept large buffers]
// glibc maps every buffer above 32 MiB apart, whatever mallopt says, and unmaps it on free: a
// GPT-2's token-embedding gradient (154 MB, twice a step when tied), its logits and AdamW's
// temporaries over it were faulted in afresh every step, 75k page faults (310 MB) a step for
// gpt-small at one rank. PyTorch's Python has the same faults; its CUDA caching allocator is
// what spares GPUs. Under Reuse the allocator below maps such buffers itself and, when one is
// freed, keeps its mapping for the next request of the same page-rounded length, the way a
// training step asks for the same sizes every time. What it keeps is bounded by the most
// large-buffer bytes the process ever held at once (so at most doubling what the step reached
// anyway), oldest given back first; Return and return_freed_memory give all of it back.
namespace {

constexpr size_t kLargeBuffer = size_t{32} << 20;  // glibc's largest mmap threshold

size_t page_rounded(size_t bytes) {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}

// The mappings of freed large buffers, by length, oldest first (Note [Kept large buffers]).
class LargeBuffers {
 public:
  // A mapping of `length` bytes: a kept one, else a fresh one (nullptr when mmap fails).
  void* take(size_t length) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      live_ += length;
      peak_live_ = std::max(peak_live_, live_);
      for (auto it = kept_.begin(); it != kept_.end(); ++it) {
        if (it->second != length) continue;
        void* base = it->first;
        kept_bytes_ -= length;
        kept_.erase(it);
        return base;
      }
    }
    void* base = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base != MAP_FAILED) return base;
    std::lock_guard<std::mutex> lock(mu_);
    live_ -= length;
    return nullptr;
  }

  void give(void* base, size_t length) {
    std::lock_guard<std::mutex> lock(mu_);
    live_ -= length;
    if (!keep_) {
      munmap(base, length);
      return;
    }
    kept_.emplace_back(base, length);
    kept_bytes_ += length;
    while (kept_bytes_ > peak_live_) {
      munmap(kept_.front().first, kept_.front().second);
      kept_bytes_ -= kept_.front().second;
      kept_.erase(kept_.begin());
    }
  }

  // Keep freed mappings from now on, or give every kept one back and keep none.
  void set_keep(bool keep) {
    std::lock_guard<std::mutex> lock(mu_);
    keep_ = keep;
    if (!keep) unmap_kept();
  }

  // Gives every kept mapping back (and goes on keeping, under Reuse).
  void release_kept() {
    std::lock_guard<std::mutex> lock(mu_);
    unmap_kept();
  }

 private:
  std::mutex mu_;
  bool keep_ = true;
  std::vector<std::pair<void*, size_t>> kept_;
  size_t kept_bytes_ = 0, live_ = 0, peak_live_ = 0;

  void unmap_kept() {
    for (const auto& [base, length] : kept_)
      munmap(base, length);
    kept_.clear();
    kept_bytes_ = 0;
  }
};

LargeBuffers& large_buffers() {
  static auto* b = new LargeBuffers();  // never destroyed: tensors may outlive static teardown
  return *b;
}

// Note [Returning released memory]: LibTorch's own CPU allocator, with plain malloc under it
// (mappings of its own above 32 MiB: Note [Kept large buffers]). Each block is gAlignment and
// two words larger than asked; the two words just below the aligned data say where the block
// starts and, for a mapping, its length (0: malloc's), so the data is its own context
// (raw_allocate works).
class ExactReuseAllocator final : public compat::Allocator {
 public:
  at::DataPtr allocate_bytes(size_t nbytes) const override {
    if (nbytes == 0) return {nullptr, nullptr, &release, at::kCPU};
    const size_t total = nbytes + c10::gAlignment + 2 * sizeof(void*);
    size_t mapped = 0;
    void* block = nullptr;
    if (total > kLargeBuffer) {
      mapped = page_rounded(total);
      block = large_buffers().take(mapped);
    } else {
      block = std::malloc(total);
    }
    if (!block) c10::profiledCPUMemoryReporter().OutOfMemory(nbytes);
    TORCH_CHECK(block, "dtorch CPU allocator: can't allocate memory: you tried to allocate ",
                nbytes, " bytes");
    const auto at = (reinterpret_cast<uintptr_t>(block) + 2 * sizeof(void*) + c10::gAlignment - 1) &
                    ~uintptr_t(c10::gAlignment - 1);
    void* data = reinterpret_cast<void*>(at);
    static_cast<void**>(data)[-1] = block;
    static_cast<size_t*>(data)[-2] = mapped;
    c10::profiledCPUMemoryReporter().New(data, nbytes);  // what the allocation meter reads
    return {data, data, &release, at::kCPU};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }

 private:
  static void release(void* data) {
    if (!data) return;
    c10::profiledCPUMemoryReporter().Delete(data);
    void* block = static_cast<void**>(data)[-1];
    const size_t mapped = static_cast<size_t*>(data)[-2];
    if (mapped > 0) {
      large_buffers().give(block, mapped);
    } else {
      std::free(block);
    }
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
  large_buffers().set_keep(policy == FreedMemory::Reuse);
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
  large_buffers().release_kept();
#ifdef M_MMAP_THRESHOLD
  malloc_trim(0);
#endif
}

}  // namespace dtorch
