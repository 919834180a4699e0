// ZeRO-Infinity's optimizer offload to NVMe: the optimizer's state (Adam's moments, SGD's
// momentum) lives in a file between its steps, and each shard steps with its state read in just
// before and written back just after, so a rank holds a few shards' state at once instead of all
// of it (Note [Optimizer state on disk]).
#pragma once

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace dtorch::zero {

// Note [Optimizer state on disk]
// DeepSpeed's ZeRO-Infinity keeps the optimizer's state on NVMe and swaps each parameter group's
// state in for its step ("offload_optimizer": {"device": "nvme"}). OptimizerOffload does so for
// ZeRO's flat shards, over the optimizer's own state objects (torch::optim's, Note [Fused
// optimizers]), so checkpoints, memory reports and the fused kernels see the state they always
// saw:
// - Between steps each state tensor keeps its TensorImpl but holds no memory (release_storage);
//   its bytes lie in one file per rank, at a slot of its own per shard and state, 4 KiB aligned
//   so that the file is opened with O_DIRECT (no copy in the page cache) where the filesystem
//   allows it; a buffer holds whole pages, so every piece's slice starts on one.
// - A step goes shard by shard, and a shard in pieces of at most a buffer's size
//   (--offload-buffer-mb): the optimizer steps a view of the piece's elements, the other shards'
//   gradients hidden from it, with a state of its own whose tensors are the piece's slices in the
//   buffers. Before a shard's first step Adam's read as the zeros the file holds until written,
//   the state it starts from (init_state), so the step makes none of its own; SGD's momentum,
//   which starts as the first gradient, is made by the step. Its step count goes back to the
//   shard's state. Adam's and SGD's updates are elementwise, so the pieces end
//   exactly where one step over the shard ends. One I/O thread reads the next piece ahead and
//   writes the last one behind while the current one steps, through at most `buffers` host
//   buffers (--offload-buffers), so a rank holds that many buffers of state, whatever the size
//   of its largest shard: gpt-small's root unit alone has 77 MB of each moment a rank at 2
//   ranks. Writes still in flight when a step ends finish during the next forward and backward;
//   the next step waits for them first. (Waiting for them at the step's end and giving the
//   buffers' pages back, MADV_DONTNEED, cost 0.6 s a step and lowered no peak.)
// - The whole file is allocated when it is made (fallocate), so too little free space is
//   an error before the first step that names the bytes needed, and the disk never fills in the
//   middle of a run. The file is unlinked as soon as it is open: however the run ends, it leaves
//   nothing behind.
// - What reads or writes the state between steps (a checkpoint's save and load) sees it mapped
//   from the file (page_in_all, MAP_SHARED): the kernel reads its pages in as they are touched
//   and, being the file's, may drop them again under pressure, so a save or a resume never
//   needs the whole state in memory of its own (gpt-xl's 6.2 GB a rank at 2 ranks). A
//   checkpoint resumes into state made on disk (init_state: the file's fresh slots read as
//   zeros) and is copied into the mapping. The next step unmaps it, writing back what changed
//   (msync); state in new tensors of its own (a checkpoint that replaced the state objects) is
//   written out in pieces. A save in the background, which copies every tensor it saves into
//   memory (Note [Checkpoints in the background]), copies this state on disk instead (snapshot):
//   the file into a second one, which the save reads mapped while the next steps change the
//   first.
// - A step the device skips (fp16's overflow, Note [Steps the device skips]) is decided on the
//   host before any shard steps (Note [Steps a part at a time]): the host steps anyway, so
//   reading the flag there costs nothing.
// The fp32 master shards stay in memory: ZeRO-1/2 publish them and ZeRO-3 gathers them.

/// Where the optimizer state goes and how much of it may be in memory at once.
struct OffloadOptions {
  std::string dir;   ///< the folder of the swap file: a fast local disk
  int buffers = 4;   ///< host buffers for state in flight (reading, stepping, writing)
  std::string name;  ///< the swap file's name in `dir`, one per rank
  /// each buffer's bytes: a shard steps in pieces of this size (whole 4 KiB pages of it)
  size_t buffer_bytes = size_t{32} << 20;
};

/// Keeps the state `opt` holds for `params` on disk between steps (Note [Optimizer state on
/// disk]). Each parameter must be a parameter of `opt` and 1-D (ZeRO's flat shards); the state
/// is made by the optimizer at its first step, as without offload. ConfigError when the folder
/// does not exist, has too little free space for the state of every parameter, `buffers` is
/// fewer than the state tensors a parameter steps with, or a buffer is under 4 KiB.
class OptimizerOffload {
 public:
  OptimizerOffload(torch::optim::Optimizer& opt, std::vector<at::Tensor> params,
                   OffloadOptions options);
  ~OptimizerOffload();
  OptimizerOffload(const OptimizerOffload&) = delete;
  OptimizerOffload& operator=(const OptimizerOffload&) = delete;

  /// Steps `opt` over the parameters piece by piece, each with its state read in and written
  /// out around it; none of them where `found_inf` (one float, as optim::step_unless takes it) is
  /// nonzero. `stepped`, if given, hears each parameter's index as its last piece has stepped
  /// (Note [Parameters on disk]). TrainingError naming the file when the disk fails.
  void step(const at::Tensor& found_inf = {}, const std::function<void(size_t)>& stepped = nullptr);
  /// Maps every state tensor's slots of the file into memory, for code that reads or writes the
  /// state between steps (a checkpoint's save and load): the kernel reads the pages in as they
  /// are touched and may drop them again, so a rank never holds all its state in memory of its
  /// own. The next step() unmaps them, changes and all.
  void page_in_all();
  /// For a checkpoint written in the background (Note [Checkpoints in the background]): the
  /// state as it is now, copied on disk into a second file beside the first (by the kernel where
  /// it can; unlinked as soon as it is made) and mapped, so that later steps do not reach it and
  /// memory does not hold it. Returns what gives, for a tensor page_in_all mapped or a view of
  /// one, the same bytes in the copy (undefined for any other tensor); the copy goes when the
  /// last tensor taken from it does. TrainingError naming the files when the disk fails.
  std::function<at::Tensor(const at::Tensor&)> snapshot();
  /// Gives every parameter without state the state the optimizer starts from (zero moments,
  /// step 0) on disk, where the file's slots hold zeros until first written: what a checkpoint
  /// is loaded into.
  void init_state();
  /// Bytes of state on disk and not in memory now.
  int64_t swapped_bytes() const;
  /// Bytes the file holds: a slot for every state tensor of every parameter.
  int64_t file_bytes() const;
  /// Bytes of each host buffer: the options' size in whole pages, at most the largest slot.
  int64_t buffer_bytes() const;
  /// Where the file was made (unlinked since, Note [Optimizer state on disk]).
  const std::string& path() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtorch::zero
