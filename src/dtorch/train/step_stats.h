// What the training loop measures of its steps: their loss over a window of batches, and their
// time per phase (--phase-times).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "dtorch/core/device.h"

namespace dtorch::train {

// Note [No host sync in a step]
// Reading a GPU tensor's value from the host (item()) waits until the device has run every
// kernel queued before it, and the queue runs dry: the next step's kernels are queued only
// after. So a step on a GPU reads nothing: the loss is added up on the device and read when a
// line is printed (--print-every, the progress line at most every bar interval or
// every_seconds) or the epoch ends, where a non-finite loss stops the run naming the steps it
// lies in (--tensorboard, which records every step's loss, reads it every step); phase times
// are CUDA events read when their window closes (PhaseTimes); the optimizers take their step
// counts from the host (Note [Fused optimizers]); --clip-grad-norm's norm stays on the device
// (Note [Clipping on the device]) and so does fp16's overflow check, which the host learns a
// step late (Note [Loss scaling], "On the device"). On the CPU, where a value is ready when
// its operation returns, the loss is read every step and a non-finite one stops the run at
// its step.

// The training loss over some batches (a step, a --print-every window, an epoch): its mean
// per batch, and the samples all ranks saw. A loss on a GPU is added up there and read only by
// mean() (Note [No host sync in a step]); one on the CPU is read as it is added.
struct LossTally {
  int64_t batches = 0;
  int64_t samples = 0;
  void add(const at::Tensor& batch_loss, int64_t batch_samples);
  double mean() const;
  /// The losses added, summed (read from the GPU where they are there).
  double sum() const;
  /// A tally that goes on from `sum` over `batches` and `samples` (a checkpoint's record of an
  /// epoch's first batches, Note [Checkpoint on a signal]).
  static LossTally resumed(double sum, int64_t batches, int64_t samples);

 private:
  double on_host_ = 0;
  at::Tensor on_device_;  // the sum of the losses added on a GPU, in float64
};

using Clock = std::chrono::steady_clock;

/// Seconds from `t` to now.
double seconds_since(Clock::time_point t);

/// The median of some steps' seconds (the mean of the two middle ones for an even count; 0 for
/// none): a step time that one slow step (a page-fault storm, a busy neighbour) does not move.
double median_seconds(std::vector<double> seconds);

// Time per phase of the training step (--phase-times, DeepSpeed's wall_clock_breakdown),
// summed over a window of optimizer steps: lap(phase) charges the time since the previous lap.
// On a GPU the laps are CUDA events on the compute stream, so a phase is the device's time for
// its kernels, not the host's time to queue them; they are read when the window closes (or
// once they have passed, every few hundred laps), never in the middle of a step.
class PhaseTimes {
 public:
  PhaseTimes(bool on, at::Device device) : on_(on), clock_(device) {}
  void start() {
    if (on_) mark_ = clock_.mark();
  }
  void lap(const char* phase) {
    if (!on_) return;
    const int64_t now = clock_.mark();
    laps_.push_back({phase, mark_, now});
    mark_ = now;
    if (laps_.size() >= 256) settle();
  }
  // Mean milliseconds per optimizer step over `steps`, and a fresh window.
  std::map<std::string, double> take_mean_ms(int64_t steps) {
    settle();
    std::map<std::string, double> ms;
    for (const auto& [phase, s] : seconds_)
      ms[phase] = 1e3 * s / static_cast<double>(std::max<int64_t>(1, steps));
    seconds_.clear();
    return ms;
  }

 private:
  struct Lap {
    const char* phase;
    int64_t from, to;
  };
  // Adds up the laps so far (waiting for the device to reach the last) and forgets their marks.
  void settle() {
    for (const Lap& l : laps_)
      seconds_[l.phase] += clock_.seconds(l.from, l.to);
    laps_.clear();
    clock_.forget_before(mark_);
  }
  bool on_;
  DeviceClock clock_;
  int64_t mark_ = 0;
  std::vector<Lap> laps_;
  std::map<std::string, double> seconds_;
};

// ", data 0.1 ms, forward 12.1 ms, backward 30.4 ms, step 6 ms", in the order a step runs
// them (empty without phase times).
std::string describe_phases(const std::map<std::string, double>& ms);

}  // namespace dtorch::train
