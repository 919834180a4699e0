// Checkpoints written while training goes on (`dtorch train --async-checkpoint`).
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "dtorch/train/step_stats.h"
#include "dtorch/train/strategy/strategy.h"

namespace dtorch::train {

/// Note [Checkpoints in the background]
/// A save in two halves. Strategy::stage copies what the checkpoint holds into host memory on the
/// training thread (a DDP writer's model tensors and a twin of its optimizer holding copies of its
/// state, checkpoint::checkpoint_state, or under a sharded layout the DDP rank's share, Note
/// [Saving replicated state]; a ZeRO rank's shards and rank 0's full tensors; pinned
/// memory for GPU tensors) and returns a SaveJob; training goes on as soon as it returns: making
/// the file (pickling, checksums) is the job's. A thread runs the job: the serialization, writes,
/// fsyncs and collectives a blocking save makes, in the same order (files first, then the rename of
/// a .dtc or rank 0's metadata.json), so a kill at any moment leaves the previous checkpoint the
/// newest complete one. Its collectives go over a twin of the strategy's group (split at the first
/// save), never interleaving with training's. At most one save is in flight: the next waits for it,
/// and logs how long. At each optimizer step while one is in flight the ranks agree, with one
/// allreduce of a flag, whether every rank's job has ended; then each rank reports its job's
/// outcome, which is the same on every rank (a sharded save exchanges its ranks' outcomes, a DDP
/// one-file save's writer broadcasts its own), so a failed write stops the run on every rank at the
/// same step, before another checkpoint is tried, with the earlier ones untouched. The run waits
/// for the last save before it writes the model and exits.
class BackgroundSaver {
 public:
  explicit BackgroundSaver(Strategy& strategy);
  /// Waits for a save in flight without reporting it (the run is ending with an error).
  ~BackgroundSaver();
  BackgroundSaver(const BackgroundSaver&) = delete;
  BackgroundSaver& operator=(const BackgroundSaver&) = delete;

  /// Waits for the save in flight (reporting it), stages a checkpoint of the strategy's model
  /// and optimizer into `dir` and starts writing it. Collective over the strategy's save group.
  void save(const std::string& dir, const checkpoint::CheckpointData& data, int keep);
  /// Called at every optimizer step: reports the save in flight once every rank's job has
  /// ended. Collective while a save is in flight. A failed save throws on every rank.
  void poll();
  /// Waits for the save in flight (saying so every 10 s) and reports it. Collective.
  void finish();
  /// Whether a save was started and poll() or finish() has not yet reported it.
  bool in_flight() const { return worker_.joinable(); }

 private:
  // Waits for this rank's job; announces a wait longer than 10 s.
  void wait_for_job();
  // Joins the finished job and rethrows its failure, with the step it was saving.
  void report();

  Strategy& strategy_;
  std::shared_ptr<comm::Communicator> twin_;
  std::thread worker_;
  std::mutex mu_;
  std::condition_variable ended_cv_;
  bool ended_ = true;  // under mu_
  std::exception_ptr failure_;
  int64_t step_ = 0;  // the save in flight's global step
  Clock::time_point started_;
};

}  // namespace dtorch::train
