// DDP's settings: the gradient buckets' sizes, unused parameters, buffers and the reduction's
// compression. Apart from ddp.h so that a run's plain settings (train/config/) name them without
// the communicator.
#pragma once

#include "dtorch/core/enum_names.h"

namespace dtorch::ddp {

enum class Compression {
  None,  ///< reduce gradients in their own dtype
  FP16,  ///< cast buckets to float16 for the allreduce (half the bytes)
  BF16,  ///< cast buckets to bfloat16 (on Gloo in LibTorch 1.13 the sum itself runs in fp32)
};
const NameTable<Compression>& names(Compression);  ///< none | fp16 | bf16

struct Options {
  /// Bytes per gradient bucket, in MiB (PyTorch's bucket_cap_mb).
  double bucket_cap_mb = 25.0;
  /// The first bucket (the last layers' gradients, ready first) is kept small so its
  /// communication starts early in backward.
  double first_bucket_cap_mb = 1.0;
  /// Allow parameters that get no gradient in a step (PyTorch's find_unused_parameters):
  /// their share is reduced as zeros at the end of backward. Off, such a parameter is an
  /// error naming it.
  bool find_unused_parameters = false;
  /// Broadcast buffers (e.g. BatchNorm statistics) from rank 0 after each backward.
  bool broadcast_buffers = true;
  Compression compression = Compression::None;
};

}  // namespace dtorch::ddp
