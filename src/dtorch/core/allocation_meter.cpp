// The CPU allocator's reports counted into current and peak bytes (Note [Allocation meter]).
#include "dtorch/core/allocation_meter.h"

#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>

#include <atomic>

#include "dtorch/core/torch_compat.h"

namespace dtorch {

struct AllocationMeter::Impl : public c10::MemoryReportingInfoBase {
  std::atomic<int64_t> current{0}, peak{0};

  bool memoryProfilingEnabled() const override { return true; }
  // The totals are LibTorch's own, counted over every thread; only alloc_size is this
  // meter's (Note [Allocator reports] for their type).
  void reportMemoryUsage(void*, int64_t alloc_size, compat::AllocatorTotal, compat::AllocatorTotal,
                         c10::Device) override {
    const int64_t now = current.fetch_add(alloc_size) + alloc_size;
    int64_t seen = peak.load();
    while (now > seen && !peak.compare_exchange_weak(seen, now)) {
    }
  }
};

struct AllocationMeter::Guard {
  c10::DebugInfoGuard guard;
  explicit Guard(std::shared_ptr<Impl> impl)
      : guard(c10::DebugInfoKind::PROFILER_STATE, std::move(impl)) {}
};

AllocationMeter::AllocationMeter()
    : impl_(std::make_shared<Impl>()), guard_(std::make_unique<Guard>(impl_)) {}
AllocationMeter::~AllocationMeter() = default;

int64_t AllocationMeter::current() const {
  return impl_->current.load();
}
int64_t AllocationMeter::peak() const {
  return impl_->peak.load();
}
void AllocationMeter::reset_peak() {
  impl_->peak.store(impl_->current.load());
}

}  // namespace dtorch
