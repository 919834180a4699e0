// Named ranges in a profiler trace (`--profile`, report/profiler.h): what dtorch does in a
// step (forward, backward, the optimizer, every collective and its wait, checkpoint staging)
// shows under its own name beside LibTorch's operators. Free when no profiler listens.
#pragma once

#include <ATen/record_function.h>

#include <string>

namespace dtorch {

/// A range named `name` from construction to destruction, on this thread, in the trace of a
/// running profiler (a user annotation, as torch.profiler.record_function makes in Python).
class TraceRange {
 public:
  explicit TraceRange(const char* name) : guard_(at::RecordScope::USER_SCOPE) {
    if (guard_.isActive()) guard_.before(name);
  }
  explicit TraceRange(const std::string& name) : guard_(at::RecordScope::USER_SCOPE) {
    if (guard_.isActive()) guard_.before(name);
  }
  TraceRange(const TraceRange&) = delete;
  TraceRange& operator=(const TraceRange&) = delete;

 private:
  at::RecordFunction guard_;
};

}  // namespace dtorch
