// Splits one worker's output stream into whole lines and puts "[n<node> r<rank>] " in front of
// each, so the launcher can interleave many workers' output without ever cutting a line.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace dtorch::launch {

/// The prefix `dtorch launch` puts in front of each line of a worker: "[n<node> r<rank>] ", or
/// "[<host> n<node> r<rank>] " when `host` is given (jobs on several nodes, whose output often
/// ends up in one file, e.g. Slurm's).
std::string rank_prefix(int node_rank, int global_rank, const std::string& host = "");

/// Pure line splitter for one stream (stdout or stderr) of one worker. Bytes come in as the pipe
/// delivers them; what comes out is always a sequence of whole, prefixed lines.
///
/// Note [Carriage returns]
/// A '\r' ends a line like '\n' does, so a progress bar's in-place updates pass through at once
/// as prefixed '\r'-terminated updates instead of piling up until the final '\n'. Bars that
/// start each update with '\r' (tqdm, dtorch's own) would still lag one update behind, so text
/// that follows a '\r' is also shown at the end of each feed() as a '\r'-terminated update, and
/// not again when its '\r' arrives (a '\n' redraws it whole). Ordinary lines (after '\n') wait
/// for their end. An empty '\r' segment passes as a bare '\r', and a '\n' right after a '\r'
/// (a "\r\n" line end, possibly split across reads) as a bare '\n', not an empty prefixed line.
class LinePrefixer {
 public:
  /// `max_line`: a line longer than this is cut and emitted with '\n', so a worker that never
  /// writes a newline cannot grow the launcher's memory without bound.
  explicit LinePrefixer(std::string prefix, std::size_t max_line = 64 * 1024);

  /// Appends to `out` every line completed by `chunk`, prefixed; keeps the unfinished rest.
  void feed(std::string_view chunk, std::string& out);
  /// Appends the unfinished rest, prefixed and ended with '\n' (the worker has exited, and the
  /// next writer must start on a fresh line). Nothing when there is no rest.
  void finish(std::string& out);
  /// Whether an unfinished line is held back.
  bool has_partial() const { return !partial_.empty(); }

 private:
  std::string prefix_;
  std::size_t max_line_;
  std::string partial_;
  std::size_t shown_ = 0;   // bytes of partial_ already shown as a '\r' update
  bool in_update_ = false;  // the current line follows a '\r': a progress update
  bool after_cr_ = false;   // the last byte handed out ended a line with '\r'
};

}  // namespace dtorch::launch
