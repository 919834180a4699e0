// Checkpoint on a signal: the ranks of a job that one of them (or a launcher, or Slurm) asked
// to stop agree on an optimizer step, checkpoint after it and exit, so that the job resumes
// where it stopped (Note [Checkpoint on a signal]).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>

#include "dtorch/launch/signals.h"

namespace c10d {
class Store;
}

namespace dtorch::train {

/// Note [Checkpoint on a signal]
/// Slurm sends a signal some time before a job's limit (`#SBATCH --signal=USR1@90`), as
/// schedulers do before preemption, so that the job can save and be requeued (Lightning's
/// auto-requeue, torchtitan's preemption handling). dtorch's checkpoint signal (USR1 unless
/// --checkpoint-signal says otherwise) does that:
///   - The launcher passes it on to its workers and waits for them (launch/launcher.h); srun
///     delivers it to every task itself.
///   - A rank that got it proposes a step to stop after, far enough ahead that every rank can
///     hear of it first: the first proposal in the job's store wins (compare-and-set). Ranks
///     that did not get it look in the store at most every 0.5 s, at the end of an optimizer
///     step; the ranks of a job are at most one step apart (their collectives hold them
///     together), so the proposal is the proposer's step, plus one for that, plus the steps of
///     two looks at the fastest step time seen, plus one. No collective is added to a step, and
///     nothing waits on a GPU.
///   - After that step every rank writes a checkpoint at once (blocking, or the background one
///     then waited for). One taken inside an epoch is named after that epoch and records how
///     many of its batches were done and their loss, so a resumed run skips them and the
///     epoch's record is as without the stop; the epoch's own checkpoint replaces it later.
///   - Every rank then exits with kCheckpointedExitCode (75); a launcher whose workers all did
///     exits with it too, and with --requeue-on-signal puts the Slurm job back in the queue.
///     A requeued job continues the run in its --out (SLURM_RESTART_COUNT), as --resume does.
/// A proposal past the run's last step ends nothing: the run finishes and exits 0.

/// Catches `signal` for the rest of the process (a program that trains and then ends: `dtorch
/// train`), so that it neither kills the process while the run starts or after it ended (the
/// launcher passes it on whenever it comes) nor is lost: one that came before the run's first
/// step stops the run at its first agreed step. Without this, a Preemption catches the signal
/// only while it lives and puts the previous handler back.
void catch_checkpoint_signal(launch::CheckpointSignal signal);

/// What train() throws after the checkpoint on the signal was written: not an error; `dtorch
/// train` exits with kCheckpointedExitCode.
struct CheckpointedOnSignal {
  int64_t global_step = 0;
};

/// Watches the checkpoint signal for the life of a run and answers, at the end of each
/// optimizer step, whether the job stops after it.
class Preemption {
 public:
  /// Installs the handler for `signal` (Off: answers never stop) and puts the previous one
  /// back when destroyed; `store` is the job's, for the agreement.
  Preemption(launch::CheckpointSignal signal, c10d::Store& store, int rank);
  ~Preemption();
  Preemption(const Preemption&) = delete;
  Preemption& operator=(const Preemption&) = delete;

  /// After optimizer step `step` (1-based over the run): whether every rank stops now.
  bool stop_after(int64_t step);
  /// The agreed step, once known.
  std::optional<int64_t> agreed() const { return agreed_; }

 private:
  // Proposes a step once the signal came, else looks for the job's at most every 0.5 s.
  void agree(int64_t step, std::chrono::steady_clock::time_point now);

  launch::CheckpointSignal signal_;
  c10d::Store& store_;
  int rank_;
  std::optional<int64_t> agreed_;
  bool proposed_ = false;
  std::chrono::steady_clock::time_point last_look_;
  std::optional<std::chrono::steady_clock::time_point> last_step_;
  double fastest_step_ = 0;  // seconds; 0 until a step was timed
};

/// The step a rank at `step` proposes, for steps of `step_seconds` (at least a microsecond)
/// and looks every `look_every` seconds (Note [Checkpoint on a signal]). Pure.
int64_t proposed_stop(int64_t step, double step_seconds, double look_every);

}  // namespace dtorch::train
