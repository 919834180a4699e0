// Gradient bucket planning for DDP: which parameters share a flat buffer and one allreduce.
// Pure functions, unit-tested without any process group.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

namespace dtorch::ddp {

// Note [Bucket order]
// Backward produces gradients roughly in reverse order of parameter registration (the last
// layer first), so buckets are filled walking the parameters backwards: bucket 0 holds the
// last layers and is ready first. It is kept small (first_cap_bytes) so the first allreduce
// starts early in backward; the others use cap_bytes. A bucket holds one dtype on one device,
// and every rank launches buckets strictly in index order, so collectives match across
// ranks even when gradients arrive in a different order.

/// What the planner needs to know about one parameter.
struct ParamSpec {
  int64_t numel = 0;
  c10::ScalarType dtype = c10::ScalarType::Float;
  c10::Device device = c10::Device(c10::DeviceType::CPU);
};

struct Bucket {
  std::vector<size_t> params;    ///< parameter indices, in buffer order
  std::vector<int64_t> offsets;  ///< element offset of each parameter in the flat buffer
  int64_t numel = 0;             ///< elements in the flat buffer
  c10::ScalarType dtype = c10::ScalarType::Float;
  c10::Device device = c10::Device(c10::DeviceType::CPU);
};

struct BucketPlan {
  std::vector<Bucket> buckets;
  /// For each parameter: its bucket and its position within that bucket.
  std::vector<std::pair<size_t, size_t>> where;
};

/// Assigns parameters (given in registration order) to buckets; see Note [Bucket order].
/// A bucket closes once it holds at least its cap, so a parameter larger than the cap gets a
/// bucket of its own. Caps must be positive.
BucketPlan plan_buckets(const std::vector<ParamSpec>& params, size_t first_cap_bytes,
                        size_t cap_bytes);

}  // namespace dtorch::ddp
