// Taking a tensor's memory away and giving it back while the tensor itself stays: sharded
// parameters keep the TensorImpl that autograd and the model hold, and only their bytes come
// and go (Note [Sharding stages]; Note [Deferred initialisation]).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/StorageImpl.h>
#include <sys/mman.h>

#include <cstddef>
#include <new>
#include <utility>

namespace dtorch {

/// Takes the memory of `t`'s storage and gives the storage zero bytes; `t` and its views keep
/// their sizes, and reading them is an error until restore_storage(). This is what FSDP does
/// with storage().resize_(0). Returns the memory: dropping it frees it.
inline at::DataPtr release_storage(const at::Tensor& t) {
  c10::StorageImpl* st = t.storage().unsafeGetStorageImpl();
  at::DataPtr old = st->set_data_ptr(at::DataPtr(nullptr, st->device()));
  st->set_nbytes(0);
  return old;
}

/// Gives `t`'s storage `nbytes` of memory, uninitialised: `memory` when given (at least
/// `nbytes`, from the storage's allocator), else fresh from the allocator. Every tensor
/// sharing the storage sees the new memory.
inline void restore_storage(const at::Tensor& t, size_t nbytes, at::DataPtr memory = {}) {
  c10::StorageImpl* st = t.storage().unsafeGetStorageImpl();
  st->set_data_ptr_noswap(memory ? std::move(memory) : st->allocator()->allocate(nbytes));
  st->set_nbytes(nbytes);
}

/// `nbytes` of zeroed memory in a mapping of its own, unmapped when the DataPtr is dropped,
/// whatever the allocator's policy for freed buffers (Note [Returning released memory]): ZeRO-3's
/// gathered units and gradient buckets, which must go back to the kernel when released.
/// Throws std::bad_alloc when the kernel refuses; an empty DataPtr for 0 bytes.
inline at::DataPtr map_memory(size_t nbytes) {
  if (nbytes == 0) return at::DataPtr(nullptr, at::kCPU);
  void* p = mmap(nullptr, nbytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  struct Mapping {
    void* p;
    size_t n;
  };
  auto unmap = [](void* ctx) {
    auto* m = static_cast<Mapping*>(ctx);
    munmap(m->p, m->n);
    delete m;
  };
  return at::DataPtr(p, new Mapping{p, nbytes}, unmap, at::kCPU);
}

/// A 1-D tensor of `n` zeros of `dtype` in memory of its own mapping (map_memory).
inline at::Tensor mapped_zeros(int64_t n, at::ScalarType dtype) {
  const size_t nbytes = static_cast<size_t>(n) * c10::elementSize(dtype);
  auto memory = std::make_shared<at::DataPtr>(map_memory(nbytes));
  void* data = memory->get();
  return at::from_blob(
      data, {n}, [memory](void*) mutable { memory.reset(); }, at::TensorOptions().dtype(dtype));
}

/// Whether `t`'s storage holds memory (false after release_storage, or for an empty tensor).
inline bool holds_storage(const at::Tensor& t) {
  return t.defined() && t.storage().nbytes() > 0;
}

}  // namespace dtorch
