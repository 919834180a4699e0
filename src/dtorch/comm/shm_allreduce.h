// Collectives through shared memory for ranks on one node (allreduce, reduce-scatter,
// allgather). Gloo's TCP path costs about a
// millisecond per allreduce here in thread hand-offs alone, more than a small model's whole
// step; a shared segment needs two barriers and one pass over the data per chunk.
// See Note [Shared-memory allreduce] in shm_allreduce.cpp.
#pragma once

#include <ATen/ATen.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace dtorch::comm {

class ShmAllreduce {
 public:
  /// Bytes of one rank's slot: larger tensors are reduced in chunks of this size.
  static constexpr int64_t kSlotBytes = 4 << 20;

  /// Rank 0 creates the segment `name` (a /dev/shm name, unique to the job and attempt); the
  /// others attach once it exists, waiting at most `timeout`. Each rank records its pid in the
  /// segment, so a peer that dies is noticed at once instead of after the timeout. Throws
  /// CommError when the segment cannot be made (e.g. /dev/shm is full or missing).
  ShmAllreduce(const std::string& name, int rank, int world, std::chrono::milliseconds timeout);
  ~ShmAllreduce();
  ShmAllreduce(const ShmAllreduce&) = delete;
  ShmAllreduce& operator=(const ShmAllreduce&) = delete;

  /// Whether this path can reduce `t` (contiguous float32/float64 on the CPU).
  static bool supports(const at::Tensor& t);
  /// In-place sum across ranks. Every rank must call it with the same numel, in the same
  /// order. Throws CommError naming the ranks that did not arrive within the timeout, or
  /// that exited.
  void sum(at::Tensor& t);
  /// Rank r receives into `out` the sum over ranks of their in[r*n, (r+1)*n), n = out.numel()
  /// (in.numel() == world*n). Summed in rank order, bit-identical to sum(). `out` may alias
  /// `in`'s own chunk.
  void reduce_scatter_sum(const at::Tensor& in, at::Tensor& out);
  /// out[q*n, (q+1)*n) receives rank q's `in` (n = in.numel(), out.numel() == world*n). Any
  /// dtype.
  void allgather(const at::Tensor& in, at::Tensor& out);

 private:
  struct Header;
  struct Counter;
  void wait_all(Counter* counters, uint64_t target, const char* phase);
  char* slot(int r) const;

  std::string name_;
  int rank_, world_;
  std::chrono::milliseconds timeout_;
  void* base_ = nullptr;
  size_t bytes_ = 0;
  Header* header_ = nullptr;
  uint64_t seq_ = 0;
  bool owner_ = false;
};

}  // namespace dtorch::comm
