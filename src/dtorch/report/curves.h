// Training curves for `dtorch plot`: the records a run wrote to metrics.jsonl, read into series
// (pure), then drawn as panels on a core/picture.h Picture: losses, test accuracy, samples/s,
// the learning rate, and where recorded the time each step phase takes, several runs overlaid.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "dtorch/core/picture.h"

namespace dtorch::report {

/// One run's series. x is the optimizer step at which a value was recorded (the end of an
/// epoch for epoch records), or the epoch count for files older than epoch records' "step".
struct RunCurves {
  struct Point {
    double x = 0, y = 0;
  };
  std::string label;
  std::vector<Point> train_loss;           ///< "step" records when there are any, else epochs
  std::vector<Point> test_loss;            ///< per epoch
  std::vector<Point> test_accuracy;        ///< per epoch, in percent
  std::vector<Point> samples_per_s;        ///< "step" records when there are any, else epochs
  std::vector<Point> lr;                   ///< "step" records when there are any, else epochs
  std::vector<double> epoch_ends;          ///< x of each epoch's end
  std::map<std::string, double> phase_ms;  ///< the last epoch's, when --phase-times recorded it
  bool x_is_step = true;                   ///< false: x counts epochs
};

/// Parses a metrics.jsonl text (`name` names it in errors). A resumed run's repeated epochs
/// keep their last record. DataError naming the line for text that is not a JSON object;
/// ConfigError when there is no epoch or step record at all.
RunCurves parse_run_curves(const std::string& text, const std::string& name,
                           const std::string& label);

/// parse_run_curves of RUN_DIR/metrics.jsonl; ConfigError naming the file and what to give
/// when it is missing.
RunCurves read_run_curves(const std::string& run_dir, const std::string& label);

/// The panels of `runs`, overlaid in one colour per run, under `title`.
Picture draw_curves(const std::vector<RunCurves>& runs, const std::string& title);

/// Tick positions for an axis over [lo, hi]: about `count` round numbers (1, 2 or 5 x 10^k
/// apart) covering the range.
std::vector<double> nice_ticks(double lo, double hi, int count = 5);

}  // namespace dtorch::report
