// What glibc does with large buffers a training step frees: keep them for the next step, or
// give them back to the operating system (Note [Returning released memory]).
#pragma once

namespace dtorch {

enum class FreedMemory {
  Reuse,   ///< keep freed buffers in the heap: the next step reuses them without page faults
  Return,  ///< unmap buffers of 4 MiB and more on free: RSS follows what is really held
};

/// Sets the policy for the process from now on (training asks for Reuse; building a model
/// without memory for Return, while it releases each unit it built). The first call also
/// makes LibTorch allocate CPU memory with plain malloc, so that a freed buffer serves the
/// next one of its size (Note [Returning released memory]).
void set_freed_memory(FreedMemory policy);

/// Gives the kernel back the free memory the heap holds (malloc_trim): after a set-up that
/// freed a copy of the model (ZeRO-3 packing parameters into units it then releases).
void return_freed_memory();

}  // namespace dtorch
