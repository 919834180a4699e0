// Taking a tensor's memory away and giving it back while the tensor itself stays: sharded
// parameters keep the TensorImpl that autograd and the model hold, and only their bytes come
// and go (Note [Sharding stages]; Note [Deferred initialisation]).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/StorageImpl.h>

#include <cstddef>
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

/// Whether `t`'s storage holds memory (false after release_storage, or for an empty tensor).
inline bool holds_storage(const at::Tensor& t) {
  return t.defined() && t.storage().nbytes() > 0;
}

}  // namespace dtorch
