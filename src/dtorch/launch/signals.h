// Signals seen by the launcher while it runs: SIGINT/SIGTERM (to forward to the workers) and
// SIGCHLD (a worker ended), turned into a readable descriptor for poll() via a self-pipe.
#pragma once

namespace dtorch::launch {

/// Installs the launcher's handlers for its lifetime and puts the previous ones back when
/// destroyed: the launcher runs inside a library, so it must not change the host's signal
/// handling for good. SIGPIPE is ignored meanwhile, so a closed stdout cannot kill the launcher
/// (and orphan its workers). One instance per process at a time (a second throws Error).
class SignalWatch {
 public:
  SignalWatch();
  ~SignalWatch();
  SignalWatch(const SignalWatch&) = delete;
  SignalWatch& operator=(const SignalWatch&) = delete;

  /// Becomes readable when a watched signal arrives; poll it, then call take_signal().
  int wake_fd() const { return read_fd_; }
  /// Empties the self-pipe and returns the latest SIGINT/SIGTERM that arrived since the last
  /// call (0: none), so SIGCHLD-only wake-ups return 0.
  int take_signal();
  /// How many SIGINT/SIGTERM arrived since construction (a second one escalates to SIGKILL).
  int signal_count() const;

 private:
  int read_fd_ = -1;
  int write_fd_ = -1;
};

}  // namespace dtorch::launch
