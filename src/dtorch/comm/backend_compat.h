// The one place that knows how LibTorch versions spell a process-group backend: 1.13's
// Gloo/NCCL classes derive from c10d::ProcessGroup, 2.x's from c10d::Backend. Both have the
// same collective signatures, so the rest of comm/ only sees `Backend`.
#pragma once

#include <torch/version.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#ifdef DTORCH_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace dtorch::comm {

#if TORCH_VERSION_MAJOR >= 2
using Backend = c10d::Backend;
#else
using Backend = c10d::ProcessGroup;
#endif

/// Whether Gloo can reduce bfloat16 tensors itself (LibTorch 2.x) or dtorch must cast to
/// float32 around the collective (1.13).
constexpr bool kGlooReducesBFloat16 = TORCH_VERSION_MAJOR >= 2;

}  // namespace dtorch::comm
