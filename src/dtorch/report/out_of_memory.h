// What a rank that ran out of memory tells its user: instead of a bare std::bad_alloc, which
// rank, how much it held, what its model state costs under each strategy, and which flag
// would fit. Note [Out of memory].
#pragma once

#include <cstdint>
#include <exception>
#include <string>

#include "dtorch/core/device.h"

namespace dtorch::report {

/// The ZeRO paper's per-rank model-state bytes for `parameters` fp32 parameters over `ranks`
/// data-parallel ranks: 4 bytes of weights, 4 of gradients and `optimizer_bytes` of
/// optimizer state per parameter (AdamW's two moments: 8, SGD's momentum: 4), each sharded
/// or not by ZeRO stage `zero_stage` (0: ddp, 1-3); ZeRO-3 adds the units that stay gathered
/// between steps (zero::MemoryStats::resident_unit_bytes).
double model_state_bytes(int zero_stage, double parameters, int ranks,
                         double resident_unit_bytes = 0, double optimizer_bytes = 8);

/// This process's memory as Linux reports it (bytes; 0 when unknown).
struct ProcessMemory {
  int64_t rss = 0;            ///< resident now (VmRSS)
  int64_t peak_rss = 0;       ///< the most ever resident (VmHWM)
  int64_t available = 0;      ///< the machine's MemAvailable now
  int64_t swap_free = 0;      ///< the machine's SwapFree now
  int64_t total = 0;          ///< the machine's MemTotal
  int64_t cgroup_limit = 0;   ///< the cgroup's memory.max (a container's or job's limit)
  int64_t cgroup_usage = 0;   ///< the cgroup's memory.current: what its processes hold now
  int64_t address_limit = 0;  ///< RLIMIT_AS (ulimit -v), when set
};
ProcessMemory process_memory();

/// Whether `e` is a failed allocation: std::bad_alloc, or LibTorch's allocator error
/// ("DefaultCPUAllocator: can't allocate memory", CUDA's "out of memory").
bool is_out_of_memory(const std::exception& e);

/// What was being trained when memory ran out.
struct MemoryContext {
  int rank = 0;
  int ranks = 1;  ///< data-parallel ranks
  std::string model;
  int64_t parameters = 0;           ///< of the whole model (0: not known yet)
  int zero_stage = 0;               ///< the strategy: 0 ddp, 1-3 ZeRO's stages
  std::string optimizer = "adamw";  ///< its name, and its state's bytes per parameter
  double optimizer_bytes = 8;
  int64_t batch_size = 0;
  bool activation_checkpointing = false;
  bool optimizer_on_disk = false;  ///< --offload-optimizer nvme
  bool params_on_disk = false;     ///< --offload-params nvme
  bool state_on_host = false;      ///< any offload on a GPU (Note [State on the host])
  at::Device device = at::kCPU;    ///< where it ran out: the machine's memory, or a GPU's
};

/// The message: the allocator's words, the rank's memory (`gpu`'s counts when c.device is a
/// GPU, else the process's), the model state per rank under each strategy at this rank count,
/// and the flags that lower it.
std::string out_of_memory_message(const std::string& allocator_says, const MemoryContext& c,
                                  const ProcessMemory& m, const DeviceMemory& gpu = {});

/// The same message before memory runs out, or "": when the optimizer's state still to be made
/// (at the first step, or when a checkpoint is loaded), `bytes_per_rank` on each of the
/// `local_ranks` ranks of this node, is more than the machine has available (MemAvailable and
/// free swap) or the job's cgroup has left (its limit less its usage), the kernel's OOM killer
/// would end the run then without a word (Note [Out of memory]).
std::string state_to_come_message(double bytes_per_rank, int local_ranks, const MemoryContext& c,
                                  const ProcessMemory& m);

}  // namespace dtorch::report
