// Training progress on rank 0's stderr: a single redrawn line on a terminal, plain periodic
// lines in logs. Formatting is pure functions; the reporter only decides when to print.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>

#include "dtorch/core/enum_names.h"

namespace dtorch::report {

/// How progress is shown.
struct ProgressConfig {
  enum class Mode {
    Auto,   ///< Bar when stderr is a terminal (see stderr_is_terminal), else Lines.
    Bar,    ///< One line redrawn in place with '\r'.
    Lines,  ///< A plain line every `every_steps` steps or `every_seconds` seconds.
    Off,    ///< Nothing.
  };
  /// Which of the above.
  Mode mode = Mode::Auto;
  /// Lines mode: print after every this many steps (0: no step-based lines).
  int64_t every_steps = 0;
  /// Lines mode: print when this many seconds passed since the last line (0: no time-based
  /// lines). With both 0, only the end of each epoch is printed.
  double every_seconds = 10.0;
  /// Bar mode: least seconds between redraws, so drawing never costs training time.
  double bar_interval_seconds = 0.1;
  /// Bar mode: characters inside the [....] bar.
  int bar_width = 20;
};
/// auto | bar | lines | off (--progress).
const NameTable<ProgressConfig::Mode>& names(ProgressConfig::Mode);

/// Where an epoch stands, as the formatters see it.
struct ProgressState {
  int64_t epoch = 0;           ///< 0-based epoch
  int64_t epochs = 0;          ///< epochs in the run (0: unknown)
  int64_t step = 0;            ///< steps done in this epoch
  int64_t total_steps = 0;     ///< steps in this epoch (0: unknown)
  double loss = 0;             ///< latest training loss
  double samples_per_s = 0;    ///< samples (all ranks) per second this epoch
  double eta_seconds = -1;     ///< time left in this epoch (< 0: unknown)
  double elapsed_seconds = 0;  ///< time spent in this epoch so far
};

/// A duration as a clock: "m:ss" under an hour, "h:mm:ss" from one hour, "--:--" when
/// unknown (negative, NaN or infinite).
std::string format_eta(double seconds);
/// Compact throughput: "950", "12.3k", "1.23M".
std::string format_rate(double per_second);
/// The bar line: "epoch 2/5 [#####.....] 120/938 loss 0.4312 12.3k samples/s ETA 0:42";
/// once step reaches total_steps, "took 1:23" (elapsed) replaces the ETA.
std::string format_bar(const ProgressState& s, int width);
/// The plain line: "epoch 2/5 step 120/938 loss 0.4312 12.3k samples/s ETA 0:42", with the
/// same ETA/took rule.
std::string format_line(const ProgressState& s);

/// True when stderr is a terminal, or when DTORCH_STDERR_TTY=1 (set by the launcher, whose
/// own stderr is the terminal while the ranks' stderr is a pipe to it).
bool stderr_is_terminal();

/// Prints progress; create it on rank 0 only. Call start_epoch, update after each step
/// (cheap: it returns at once unless it is time to print), finish_epoch at the end.
class ProgressReporter {
 public:
  /// `out` defaults to stderr; `clock` (seconds, monotonic) defaults to steady_clock and
  /// exists for tests. The mode is resolved here, once.
  explicit ProgressReporter(ProgressConfig config, std::FILE* out = stderr,
                            std::function<double()> clock = {});

  void start_epoch(int64_t epoch, int64_t epochs, int64_t total_steps);
  /// `step`: steps done this epoch; `samples`: samples done this epoch over all ranks.
  void update(int64_t step, double loss, int64_t samples);
  /// The same with the latest loss read by `loss` only when a line is printed (Note [No host
  /// sync in a step] in train/step_stats.h: reading a GPU's loss waits for the device).
  void update(int64_t step, std::function<double()> loss, int64_t samples);
  /// Prints the final state of the epoch (ending the bar's line with a newline).
  void finish_epoch();

  /// Mode after resolving Auto.
  ProgressConfig::Mode mode() const { return mode_; }

 private:
  ProgressState state_at(double now) const;
  void print(const ProgressState& s, bool final);

  ProgressConfig config_;
  ProgressConfig::Mode mode_;
  std::FILE* out_;
  std::function<double()> clock_;
  std::function<double()> loss_;  // the latest loss, read when printed
  ProgressState state_;
  int64_t samples_ = 0;
  double epoch_start_ = 0;
  double last_print_ = 0;
  bool printed_ = false;  // anything printed this epoch
  int64_t last_print_step_ = 0;
  size_t last_bar_len_ = 0;
};

}  // namespace dtorch::report
