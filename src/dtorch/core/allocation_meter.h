// Bytes LibTorch's CPU allocator hands out while a meter is on: the memory a phase of a step
// takes (activations kept by forward, the peak during backward) exactly, where peak RSS mixes it
// with everything else the process ever held. Benchmarks report it; the planner measures a
// CNN's activations with it.
#pragma once

#include <cstdint>
#include <memory>

namespace dtorch {

/// Note [Allocation meter]: LibTorch's default CPU allocator reports every allocation and free
/// to the thread's profiler state when that state says memory profiling is on; the meter is
/// such a state, installed for its lifetime on the thread that creates it (LibTorch carries it
/// into the threads it starts for that thread's work). It counts the bytes allocated since it
/// began and not yet freed, and their peak. Frees of blocks allocated before it began are not
/// reported by LibTorch and do not count.
class AllocationMeter {
 public:
  AllocationMeter();
  ~AllocationMeter();
  /// Bytes allocated while the meter was on and not yet freed.
  int64_t current() const;
  /// The most current() has been since the meter began or since reset_peak().
  int64_t peak() const;
  /// Starts a new peak from current().
  void reset_peak();

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
  struct Guard;
  std::unique_ptr<Guard> guard_;
};

}  // namespace dtorch
