// Signals seen by the launcher while it runs: SIGINT/SIGTERM (to forward to the workers), the
// checkpoint signal (Note [Checkpoint on a signal]) and SIGCHLD (a worker ended), turned into a
// readable descriptor for poll() via a self-pipe.
#pragma once

#include "dtorch/core/enum_names.h"

namespace dtorch::launch {

/// The signal that asks a job to checkpoint and stop (Note [Checkpoint on a signal] in
/// train/preemption.h): what Slurm's `--signal=USR1@90` sends before a job's time limit.
enum class CheckpointSignal { Usr1, Usr2, Off };
const NameTable<CheckpointSignal>& names(CheckpointSignal);
/// Its signal number; 0 for Off.
int signal_number(CheckpointSignal s);

/// The exit code of a worker that checkpointed on the checkpoint signal and stopped, and of
/// the launcher whose workers all did: 75, EX_TEMPFAIL ("try again later").
constexpr int kCheckpointedExitCode = 75;

/// Installs the launcher's handlers for its lifetime and puts the previous ones back when
/// destroyed: the launcher runs inside a library, so it must not change the host's signal
/// handling for good. SIGPIPE is ignored meanwhile, so a closed stdout cannot kill the launcher
/// (and orphan its workers). One instance per process at a time (a second throws Error).
class SignalWatch {
 public:
  /// `checkpoint_signal` (0: none) is watched too; see take_checkpoint_request.
  explicit SignalWatch(int checkpoint_signal = 0);
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
  /// Whether the checkpoint signal arrived since the last call.
  bool take_checkpoint_request();

 private:
  int read_fd_ = -1;
  int write_fd_ = -1;
  int checkpoint_signal_ = 0;
};

}  // namespace dtorch::launch
