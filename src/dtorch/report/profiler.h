// `--profile FIRST:LAST`: where a step's time goes, as a Chrome / Perfetto trace of optimizer
// steps FIRST to LAST from LibTorch's Kineto profiler, one file per rank, with dtorch's own
// ranges named in it (core/trace_range.h). Open it at ui.perfetto.dev or chrome://tracing.
#pragma once

#include <cstdint>
#include <string>

#include <c10/core/Device.h>

namespace dtorch::report {

/// Optimizer steps FIRST to LAST, 1-based and inclusive (the run's global step count).
struct StepRange {
  int64_t first = 0;  ///< 0: none
  int64_t last = 0;
  bool empty() const { return first == 0; }
  bool contains(int64_t step) const { return !empty() && step >= first && step <= last; }
};

/// "10:12" as {10, 12}, "" as none; anything else is a ConfigError naming `flag`, the value as
/// given and the form it takes.
StepRange parse_step_range(const std::string& spec, const std::string& flag);

/// The trace file rank `rank` writes into `folder`: <folder>/trace.rank<N>.json.
std::string trace_path(const std::string& folder, int rank);

/// Throws ConfigError, naming this LibTorch's version and what has the profiler, when it cannot
/// write a trace (Debian's 1.13 is built without Kineto). Runs the profiler for nothing once.
void require_profiler();

/// Runs the profiler over a range of steps and writes its trace when the last one ends.
class StepProfiler {
 public:
  /// Traces the CPU, and CUDA's kernels with `device` a GPU, into `path` (replaced whole).
  StepProfiler(StepRange range, std::string path, c10::Device device);
  ~StepProfiler();
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  /// Before step `step` begins: at the range's first step the profiler starts.
  void before_step(int64_t step);
  /// After step `step` ended: at the range's last step the profiler stops and the trace is
  /// written (CheckpointError when it cannot be). Returns whether it was written now.
  bool after_step(int64_t step);

 private:
  StepRange range_;
  std::string path_;
  c10::Device device_;
  bool running_ = false;
};

}  // namespace dtorch::report
