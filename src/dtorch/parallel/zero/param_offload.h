// ZeRO-Infinity's parameter offload to NVMe: ZeRO-3's fp32 master shards live in a file between
// their uses, and a rank holds in memory only the shards it is gathering or stepping (Note
// [Parameters on disk]).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dtorch/parallel/zero/offload.h"

namespace dtorch::zero {

// Note [Parameters on disk]
// DeepSpeed's ZeRO-Infinity keeps ZeRO-3's parameter partitions on NVMe ("offload_param":
// {"device": "nvme"}) and swaps each in before its gather. ParamOffload keeps ZeRO's fp32 master
// shards (a rank's share of every unit: what its gathers start from and what the optimizer
// steps) in one file per rank, mapped (MAP_SHARED), each master a slot of it 4 KiB aligned. So
// whatever reads or writes a master (the gather, the step, a checkpoint's save and load,
// full_params) does so as always, and the kernel pages it in as touched. What keeps the shards
// out of memory is letting each go after its use:
// - A gather copies the unit's master into the gathered buffer, then evicts it
//   (MADV_DONTNEED: its pages leave the process at once, what changed stays in the file's
//   pages and starts for the disk, sync_file_range), and reads the next unit's ahead
//   (MADV_WILLNEED).
// - The step steps shard by shard with each shard's optimizer state read in around it (Note
//   [Optimizer state on disk]; parameters on disk need the state there too) and evicts each
//   master as its last piece is stepped: a rank holds one shard's parameters at a time.
// - Each step begins by evicting every master (a checkpoint's save or an evaluation touched
//   them) and telling the kernel to drop what has reached the disk from its cache
//   (POSIX_FADV_DONTNEED), so the file's pages do not pile up in memory outside the process.
// - A checkpoint saved in the background reads the shards from a copy of the file, made on
//   disk when the save begins (snapshot), as it reads the optimizer's state.
// The kernel pages the parameters, not the optimizer offload's buffers: ds_config's
// offload_param buffer_count and buffer_size change nothing here. The file is allocated whole
// and unlinked when made (offload_file.h). On tmpfs the file is memory itself, and eviction
// only moves its pages out of the process's count.

/// ZeRO-3's master shards in a file between uses (Note [Parameters on disk]).
class ParamOffload {
 public:
  /// A file in options.dir (named options.name) with a slot of fp32 elements for each of
  /// `numels`, mapped. ConfigError when the folder does not exist or has too little space.
  ParamOffload(const std::vector<int64_t>& numels, const OffloadOptions& options);
  ~ParamOffload();
  ParamOffload(const ParamOffload&) = delete;
  ParamOffload& operator=(const ParamOffload&) = delete;

  /// Slot k: a 1-D fp32 tensor of numels[k] elements in the mapping, zeros until written. It
  /// keeps the mapping alive after the ParamOffload is gone.
  at::Tensor slot(size_t k) const;
  /// Slot k's pages leave this process's memory; what changed goes to the disk.
  void evict(size_t k);
  /// Starts reading slot k from the disk.
  void read_ahead(size_t k);
  /// Every slot evicted, and what has reached the disk dropped from the kernel's cache.
  void evict_all();
  /// For a checkpoint written in the background (Note [Checkpoints in the background]): the
  /// slots as they are now, copied on disk into a second file (offload_file::copy_and_map), so
  /// that later steps do not reach them and memory does not hold them. Returns what gives, for
  /// a slot or a view of one, the same bytes in the copy (undefined for any other tensor).
  std::function<at::Tensor(const at::Tensor&)> snapshot();
  /// Bytes the file holds.
  int64_t file_bytes() const;
  /// Where the file was made (unlinked since).
  const std::string& path() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtorch::zero
