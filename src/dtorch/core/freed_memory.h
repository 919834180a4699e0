// What glibc does with large buffers a training step frees: keep them for the next step, or
// give them back to the operating system (Note [Returning released memory]).
#pragma once

namespace dtorch {

enum class FreedMemory {
  Reuse,   ///< keep freed buffers in the heap: the next step reuses them without page faults
  Return,  ///< unmap buffers of 4 MiB and more on free: RSS follows what is really held
};

/// Sets the policy for the rest of the process (DDP and ZeRO-1/2 ask for Reuse, ZeRO-3 for
/// Return). Return, once set, stays: a process that holds a ZeRO-3 model shards it to save
/// memory, and reusing freed buffers would hold it again.
void set_freed_memory(FreedMemory policy);

}  // namespace dtorch
