// Bucket assignment by size in reverse registration order (see Note [Bucket order]).
#include "dtorch/parallel/ddp/bucket_plan.h"

#include <c10/core/ScalarTypeToTypeMeta.h>

#include <map>

#include "dtorch/core/error.h"

namespace dtorch::ddp {

BucketPlan plan_buckets(const std::vector<ParamSpec>& params, size_t first_cap_bytes,
                        size_t cap_bytes) {
  DTORCH_CHECK_T(ConfigError, first_cap_bytes > 0 && cap_bytes > 0,
                 "bucket capacities must be positive (got ", first_cap_bytes, " and ", cap_bytes,
                 " bytes)");
  BucketPlan plan;
  plan.where.resize(params.size());
  // One open bucket per (device, dtype); the first bucket closed overall uses the small cap.
  std::map<std::pair<std::string, int>, size_t> open;  // key -> index into plan.buckets
  std::vector<size_t> bytes;
  bool first_closed = false;

  auto close = [&](std::map<std::pair<std::string, int>, size_t>::iterator it) {
    first_closed = true;
    open.erase(it);
  };

  for (size_t k = params.size(); k-- > 0;) {
    const ParamSpec& p = params[k];
    auto key = std::make_pair(p.device.str(), static_cast<int>(p.dtype));
    auto it = open.find(key);
    if (it == open.end()) {
      plan.buckets.push_back(Bucket{{}, {}, 0, p.dtype, p.device});
      bytes.push_back(0);
      it = open.emplace(key, plan.buckets.size() - 1).first;
    }
    size_t b = it->second;
    Bucket& bucket = plan.buckets[b];
    plan.where[k] = {b, bucket.params.size()};
    bucket.params.push_back(k);
    bucket.offsets.push_back(bucket.numel);
    bucket.numel += p.numel;
    bytes[b] += static_cast<size_t>(p.numel) * c10::elementSize(p.dtype);
    if (bytes[b] >= (first_closed ? cap_bytes : first_cap_bytes)) close(it);
  }
  return plan;
}

}  // namespace dtorch::ddp
