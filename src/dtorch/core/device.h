// Which device a rank computes on, and what dtorch needs from a CUDA device: the rule that gives
// each local rank its GPU, the caching allocator's peaks, events that time the device's work, and
// a stream that copies the next batch while the current one trains. The one place outside comm/
// that includes CUDA headers; every function also works in a LibTorch without CUDA.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dtorch/core/enum_names.h"

namespace dtorch {

/// cpu | cuda | auto (--device; Note [One GPU per rank]).
enum class DeviceKind { CPU, CUDA, Auto };
const NameTable<DeviceKind>& names(DeviceKind);

/// What this process can use: whether this LibTorch was built with CUDA, and how many GPUs
/// it sees (after CUDA_VISIBLE_DEVICES).
struct CudaAvailability {
  bool compiled = false;
  int visible = 0;
};
/// This process's CudaAvailability (0 GPUs without a CUDA LibTorch).
CudaAvailability cuda_availability();

// Note [One GPU per rank]
// Each rank computes on one GPU, the local rank's: cuda:LOCAL_RANK, as torchrun scripts do with
// torch.cuda.set_device(local_rank). More local ranks than visible GPUs would put two ranks on
// one GPU, which NCCL refuses ("Duplicate GPU detected"): a ConfigError naming both numbers and
// CUDA_VISIBLE_DEVICES, unless the job asked for Gloo (DTORCH_BACKEND=gloo), which carries CUDA
// tensors through host memory (Note [CUDA tensors over Gloo] in comm/communicator_collectives.cpp);
// then rank r shares GPU r mod the count. That is slow and meant for testing multi-rank GPU code on
// one GPU.

/// The device `spec` means for the rank `local_rank` of `local_world_size`
/// on its node, under Note [One GPU per rank]; auto is CUDA when this LibTorch has it and a GPU
/// is visible, else the CPU. `flag` names the setting in errors ("--device"). ConfigError for
/// cuda without a CUDA LibTorch or without a visible GPU, and for too many ranks.
at::Device resolve_device(DeviceKind spec, int local_rank, int local_world_size,
                          const CudaAvailability& cuda = cuda_availability(),
                          bool share_gpus = false, const std::string& flag = "--device");

/// Makes `d` the current CUDA device of this process (torch.cuda.set_device), so that new CUDA
/// tensors, streams and NCCL's communicators use it, and starts CUDA on it. Nothing for the CPU.
void use_device(at::Device d);

/// The GPU's name ("NVIDIA H100 80GB HBM3"); "cpu" for the CPU.
std::string gpu_name(at::Device d);

/// Waits until every operation queued on `d` has finished (nothing for the CPU).
void synchronize(at::Device d);

/// While on, any operation that makes the host wait for a GPU (item(), a copy to the host, a
/// stream synchronize) throws, as torch.cuda.set_sync_debug_mode("error") makes it (Note [No
/// host sync in a step] in train/step_stats.h). Nothing without CUDA.
void set_sync_errors(bool on);

/// The CUDA caching allocator's counts for a GPU, in bytes (all 0 for the CPU): what tensors
/// hold now and at most since the last reset, what the allocator has reserved from the driver
/// now and at most, and the device's total memory.
struct DeviceMemory {
  int64_t allocated = 0;
  int64_t peak_allocated = 0;
  int64_t reserved = 0;
  int64_t peak_reserved = 0;
  int64_t total = 0;
};
DeviceMemory device_memory(at::Device d);
/// Starts the peaks of device_memory() again from what is held now.
void reset_peak_memory(at::Device d);

/// Elapsed time of the work queued on a device between marks: CUDA events on the current
/// stream of a GPU, whose work runs after the host has moved on; the host's clock on the CPU,
/// where every operation has finished when it returns.
class DeviceClock {
 public:
  explicit DeviceClock(at::Device d);
  ~DeviceClock();
  DeviceClock(const DeviceClock&) = delete;
  DeviceClock& operator=(const DeviceClock&) = delete;
  /// A mark at this point of the device's queue; marks are numbered from 0 in order.
  int64_t mark();
  /// Seconds between marks `from` and `to` (waits until the device has reached `to`).
  double seconds(int64_t from, int64_t to);
  /// Forgets every mark before `keep_from` (their numbers stay taken).
  void forget_before(int64_t keep_from);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Note [Batches to the GPU]
// A batch leaves the loader in host memory. Copied from pageable memory, cudaMemcpy blocks the
// host and the GPU waits for it; from pinned (page-locked) memory the copy is a DMA the host only
// queues. The loader's threads pin each batch (data::Prefetcher's workers), and the next batch's
// copy is queued on a stream of its own while the current step's kernels run; the compute stream
// waits for the copy with an event, and the batch's memory is recorded as used by the compute
// stream (record_stream), so the caching allocator never hands it to the next copy before the
// step that reads it has finished.

/// Host tensors in pinned memory, for copies the host only queues (the tensors themselves when
/// there is no CUDA, or they are pinned already).
std::vector<at::Tensor> pinned(const std::vector<at::Tensor>& host);

/// Copies host tensors to a GPU on a stream of its own (Note [Batches to the GPU]); on the CPU
/// it hands the tensors back unchanged.
class DeviceCopier {
 public:
  explicit DeviceCopier(at::Device d);
  ~DeviceCopier();
  DeviceCopier(const DeviceCopier&) = delete;
  DeviceCopier& operator=(const DeviceCopier&) = delete;
  /// Queues the copy of `host` (pinned for overlap) and returns it; call ready() before using
  /// the result on the current stream.
  void start(std::vector<at::Tensor> host);
  /// The tensors of the last start(), usable on the current stream from now on.
  std::vector<at::Tensor> ready();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// A small tensor's value for the host without draining a GPU's queue (Note [No host sync in a
/// step] in train/step_stats.h): start() queues its copy into pinned host memory behind the
/// work queued so far, and take() waits for that copy alone, typically a step later, when the
/// device finished it long ago while the host queued the next step's work. On the CPU the
/// value is copied at once.
class LateRead {
 public:
  LateRead();
  ~LateRead();
  LateRead(const LateRead&) = delete;
  LateRead& operator=(const LateRead&) = delete;
  /// Queues the copy of `t` to the host, replacing one not taken yet.
  void start(const at::Tensor& t);
  bool pending() const;
  /// The host copy of the last start()'s tensor, waiting for it if needed; undefined when
  /// nothing is pending.
  at::Tensor take();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtorch
