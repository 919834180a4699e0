// Where a run starts: from scratch, or from the newest checkpoint in --out (asked for, or a
// restarted group, or a later elastic round), with the learning-rate schedule that checkpoint
// recorded; and what a checkpoint records of its run.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>

#include "dtorch/comm/communicator.h"
#include "dtorch/models/model.h"
#include "dtorch/train/config/lr_schedule.h"
#include "dtorch/train/config/run_config.h"
#include "dtorch/train/step_stats.h"
#include "dtorch/train/strategy/strategy.h"

namespace dtorch::train {

/// The learning-rate schedule of a run: the configuration, the peak rate and the run's length
/// fix every step's rate (Note [Learning-rate schedules]); checkpoints keep all three.
struct Schedule {
  LrScheduleConfig config;
  double lr = 0;
  int64_t total_steps = 0;

  double at(int64_t step) const { return lr_at(config, lr, step, total_steps); }
  nlohmann::json to_json() const {
    nlohmann::json j = config;
    j["lr"] = lr;
    j["total_steps"] = total_steps;
    return j;
  }
  bool operator==(const Schedule& o) const { return to_json() == o.to_json(); }
};

/// The schedule a checkpoint's metadata recorded; nullopt for checkpoints written before
/// schedules were recorded (they trained at a constant rate).
std::optional<Schedule> schedule_of(const std::string& metadata_json, const std::string& path);

/// A checkpoint's metadata: the run configuration as config.json holds it (Note [One list of
/// settings]), and what the run derived: the job's size, the image input the model was built
/// for, the learning-rate schedule's state. "model" is repeated at the top for readers that
/// know nothing else of dtorch (`dtorch checkpoint`, a Python script).
std::string config_json(const TrainConfig& c, int world, const Schedule& schedule,
                        const models::ImageInput& input);

/// Whether the run continues the one in c.out: --resume, a restart of the group, a later
/// elastic round, a requeued Slurm job (SLURM_RESTART_COUNT, Note [Checkpoint on a signal]).
bool continues_run(const TrainConfig& c, const launch::RankInfo& job);

/// How far a run got inside an epoch when it checkpointed on the checkpoint signal (Note
/// [Checkpoint on a signal]): the batches done, and their losses.
struct EpochProgress {
  int64_t batches = 0;  ///< 0: at the epoch's start
  LossTally tally;
};

/// `metadata_json` (config_json's) with `progress` recorded, for a checkpoint taken inside an
/// epoch.
std::string with_epoch_progress(const std::string& metadata_json, const EpochProgress& progress);

/// The progress a checkpoint's metadata recorded; batches 0 for one taken at an epoch's end.
/// CheckpointError naming `path` when the record is malformed.
EpochProgress epoch_progress_of(const std::string& metadata_json, const std::string& path);

/// Where the epochs start.
struct StartPoint {
  int64_t epoch = 0;
  int64_t global_step = 0;
  Schedule schedule;     ///< the checkpoint's, or the one this run's settings give
  bool resumed = false;  ///< a checkpoint was looked for (metrics.jsonl is appended to)
  EpochProgress within;  ///< where inside `epoch` it starts
};

/// Loads the newest checkpoint in c.out into `strategy` when the run resumes (--resume, a
/// restart of the group, a later elastic round), logging on `lead`; every rank must have found
/// the same one (CheckpointError otherwise). `schedule` is this run's own. Collective.
StartPoint resume_run(const TrainConfig& c, Strategy& strategy, comm::Communicator& comm,
                      const Schedule& schedule, bool lead);

}  // namespace dtorch::train
