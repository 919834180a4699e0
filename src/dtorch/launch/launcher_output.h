// Where a launcher's output goes: the console that its workers' lines share with its own
// messages, and one log file per rank (--log-dir).
#pragma once

#include <string>
#include <vector>

#include "dtorch/launch/launcher.h"

namespace dtorch::launch {

// The launcher's stdout and stderr, shared by every worker's output and the launcher's own
// messages.
//
// Note [Progress bars among other output]
// A worker's '\r' update leaves the cursor at the start of its line (see Note [Carriage
// returns]). When anyone else writes next to the same file, the launcher first ends that line
// with '\n', so the bar stays readable and the other line is not written over it.
class Console {
 public:
  Console();

  /// `fd` is STDOUT_FILENO or STDERR_FILENO; `owner` identifies the writer.
  void write(int fd, int owner, const std::string& text);
  /// A line of the launcher's own, on stderr.
  void message(const std::string& line);

 private:
  static constexpr int kNone = -1;
  static constexpr int kLauncher = -2;
  bool shared_;
  int cr_owner_[2] = {kNone, kNone};
};

// Note [Log files]
// torchrun's --log-dir writes LOG_DIR/<run id>_<random>/attempt_<n>/<local rank>/stdout.log and
// stderr.log, and only for the streams named by --redirects or --tee. dtorch writes one file per
// global rank, LOG_DIR/rank<rank>.log: both streams, unprefixed, whole lines in the order they
// arrived, with each restart and the launcher's verdict on a failed rank written into it. The
// name alone says whose output it is, also in a folder that all nodes share, and no second flag
// is needed. The console keeps the prefixed stream of the ranks --show-ranks selects.
class RankLogs {
 public:
  /// `append`: keep what earlier rounds of an elastic job wrote (Note [Elastic rendezvous]).
  explicit RankLogs(const LaunchOptions& o, bool append = false);
  ~RankLogs();
  RankLogs(const RankLogs&) = delete;
  RankLogs& operator=(const RankLogs&) = delete;

  /// The file of local rank `lr`, or -1 without --log-dir.
  int fd(int lr) const { return fds_.empty() ? -1 : fds_[static_cast<std::size_t>(lr)]; }

  void write(int lr, const std::string& text) const;

 private:
  void close_all();
  std::vector<int> fds_;
};

}  // namespace dtorch::launch
