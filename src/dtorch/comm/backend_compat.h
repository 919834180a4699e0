// The one place in comm/ that knows how LibTorch 1.13 and 2.x differ: how a process-group
// backend is spelt, and which collectives Gloo has
// (how a TCPStore is served: launch/store.cpp). The rest of
// comm/ asks these names and compiles unchanged against both.
#pragma once

#include <torch/version.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#ifdef DTORCH_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace dtorch::comm {

// 1.13's Gloo/NCCL classes derive from c10d::ProcessGroup, 2.x's from c10d::Backend; both
// have the same collective signatures.
#if TORCH_VERSION_MAJOR >= 2
using Backend = c10d::Backend;
#else
using Backend = c10d::ProcessGroup;
#endif

// Note [Gloo on 2.x]
// LibTorch 1.13's Gloo has no reduce-scatter, no flat allgather (_allgather_base) and no
// bfloat16: dtorch casts bf16 to fp32 around a reduction, sends it as fp16 bit patterns
// through an allgather, and builds reduce-scatter as a ring over send/recv (Note
// [Reduce-scatter on Gloo] in communicator_collectives.cpp). 2.x's Gloo has all three natively.
// Measured over Gloo on one machine at 2 and 4 ranks, 64 KiB to 32 MiB (BENCHMARKS.md, `make
// bench`): Gloo's own reduce-scatter takes 2.1x the time of dtorch's ring (geometric mean; up to 3x
// at 4 ranks and 32 MiB), its flat allgather 0.94x of dtorch's per-chunk one. DTORCH_GLOO_
// COLLECTIVES=auto keeps dtorch's for both; Gloo's allgather is the one worth switching to.

/// Whether Gloo can reduce bfloat16 tensors itself (LibTorch 2.x) or dtorch must cast to
/// float32 around the collective (1.13).
constexpr bool kGlooReducesBFloat16 = TORCH_VERSION_MAJOR >= 2;
/// Whether Gloo has _reduce_scatter_base (one flat input, one flat output).
constexpr bool kGlooHasReduceScatter = TORCH_VERSION_MAJOR >= 2;
/// Whether Gloo has _allgather_base (allgather_into_tensor: one flat output).
constexpr bool kGlooHasFlatAllgather = TORCH_VERSION_MAJOR >= 2;

/// What DTORCH_GLOO_COLLECTIVES=auto picks: whether Gloo's own reduce-scatter and flat
/// allgather beat dtorch's ring and per-chunk allgather (measured, Note [Gloo on 2.x]).
constexpr bool kGlooNativeIsFaster = false;

/// Gloo's own reduce-scatter of a flat `in` into `out` (sum); only when
/// kGlooHasReduceScatter.
inline c10::intrusive_ptr<c10d::Work> native_reduce_scatter(Backend& pg, at::Tensor& out,
                                                            at::Tensor& in) {
#if TORCH_VERSION_MAJOR >= 2
  c10d::ReduceScatterOptions o;
  o.reduceOp = c10d::ReduceOp::SUM;
  return pg._reduce_scatter_base(out, in, o);
#else
  TORCH_CHECK(false, "Gloo in LibTorch ", TORCH_VERSION, " has no reduce-scatter");
#endif
}

/// Gloo's own allgather of `in` into the flat `out`; only when kGlooHasFlatAllgather.
inline c10::intrusive_ptr<c10d::Work> native_allgather_into(Backend& pg, at::Tensor& out,
                                                            at::Tensor& in) {
#if TORCH_VERSION_MAJOR >= 2
  return pg._allgather_base(out, in, c10d::AllgatherOptions());
#else
  TORCH_CHECK(false, "Gloo in LibTorch ", TORCH_VERSION, " has no flat allgather");
#endif
}

}  // namespace dtorch::comm
