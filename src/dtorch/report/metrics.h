// Training metrics as JSON Lines: one JSON object per line, flushed at once, so a run that
// dies keeps every record written so far and tools can tail the file while it grows.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>

namespace dtorch::report {

/// What one epoch achieved.
struct EpochRecord {
  int64_t epoch = 0;         ///< 0-based epoch
  int64_t step = 0;          ///< optimizer steps taken over the run when the epoch ended
  double train_loss = 0;     ///< mean training loss over the epoch
  double test_loss = 0;      ///< mean loss on the test split
  double test_accuracy = 0;  ///< fraction (0..1) of test samples classified right
  double samples_per_s = 0;  ///< training samples per second, all ranks together
  double seconds = 0;        ///< wall time of the epoch (training and evaluation)
  double lr = 0;             ///< the learning rate of the epoch's last optimizer step
  /// With --phase-times: mean milliseconds per optimizer step of each phase (data, forward,
  /// backward, step; under a pipeline forward_backward), written as "<phase>_ms".
  std::map<std::string, double> phase_ms;
  /// What only some runs have, written under these keys: on a GPU the caching allocator's
  /// peaks over the epoch (gpu_peak_allocated_bytes, gpu_peak_reserved_bytes), under fp16 the
  /// loss scale at the epoch's end and the optimizer steps skipped so far (loss_scale,
  /// skipped_steps).
  std::map<std::string, double> more;
};

/// The phases a step is timed in (--phase-times), in the order a step runs them; a pipeline
/// times "forward_backward" where the others time "forward" and "backward".
inline constexpr const char* kStepPhases[] = {"data", "forward", "backward", "forward_backward",
                                              "step"};

/// The record as one line of JSON (no newline):
/// {"kind":"epoch","epoch":..,"step":..,"train_loss":..,"test_loss":..,"test_accuracy":..,
///  "samples_per_s":..,"seconds":..,"lr":..[,"<phase>_ms":..][, more..]}. Non-finite numbers
///  become null.
std::string epoch_record_json(const EpochRecord& r);
/// Any record: {"kind":kind, ...numbers...}, keys after "kind" in sorted order; a whole number
/// is written as an integer.
std::string record_json(const std::string& kind, const std::map<std::string, double>& numbers);

/// Keeps the records of the JSONL file at `path` whose "step" is at most `step`, and those
/// without one; drops the rest, and any line that is not a JSON object (one a crash cut
/// short). A resumed run calls it with its checkpoint's step, so the epochs and steps it trains
/// again are recorded once (Note [One run per folder] in train/run_folder.h). The file is
/// replaced atomically, and only when a record goes; no file is nothing to do. Throws
/// ConfigError naming the file when it cannot be read or written.
void keep_records_through(const std::string& path, int64_t step);

/// Appends records to a JSONL file (written by rank 0 only).
class MetricsWriter {
 public:
  /// Opens `path` for appending (or truncates it when !append), creating parent
  /// directories. Throws ConfigError naming the path when it cannot.
  explicit MetricsWriter(const std::string& path, bool append = true);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  void write_epoch(const EpochRecord& r);
  void write(const std::string& kind, const std::map<std::string, double>& numbers);
  /// Writes one line of already-serialised JSON (must be a single line) and flushes.
  void write_line(const std::string& json);

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
};

}  // namespace dtorch::report
