// One run per --out folder: a new run never mixes with, or silently replaces, an earlier one
// (Note [One run per folder]).
#pragma once

#include <string>
#include <vector>

#include "dtorch/train/config/run_config.h"

namespace dtorch::train {

// Note [One run per folder]
// A run folder holds one run: its config.json, metrics.jsonl, checkpoints (checkpoint-NNNNNN.dtc,
// step-NNNNNN/, the pipeline's pp<s>-of-<n>/ and pipeline.json) and final model. A new run
// into a folder that holds another run's checkpoints or model would leave the two mixed (and
// --resume would later pick the older run's newer checkpoint), so it is refused before
// anything is written, rerunning the same configuration too: --resume continues the run,
// --overwrite replaces it. --overwrite first moves the earlier run's files (dtorch's names
// only; the user's own files stay) into <out>/.overwritten, and removes that folder once the
// new run's first checkpoint is written. Until then nothing is lost: a run that stops before
// it (a kill, a failure) leaves the earlier run set aside, and the next run into the folder
// without --overwrite puts it back first, so --resume continues it. A group restarted
// (--max-restarts) or an elastic round resumes the folder as it is. config.json is written
// once the run has loaded its checkpoint (a failed --resume leaves the folder's record as it
// was), and a resumed run's metrics.jsonl keeps the records up to the checkpoint's step only
// (report::keep_records_through), so an epoch trained again after a failed save is not
// recorded twice.

/// The entries of `out` that a dtorch run wrote (names only, sorted): config.json,
/// metrics.jsonl, traces, model files, checkpoints and stage folders. Empty when none or no
/// folder.
std::vector<std::string> run_entries(const std::string& out);

/// Every rank, before the run writes anything: ConfigError when c.checkpointing.out holds
/// another run's checkpoints or model (or holds one set aside by an unfinished --overwrite)
/// and this run neither resumes (`resumes`: --resume, a restart, an elastic round) nor has
/// --overwrite. Reads only.
void check_run_folder(const TrainConfig& c, bool resumes);

/// Rank 0, after check_run_folder and before any rank reads the folder's checkpoints: puts
/// back a run an unfinished --overwrite set aside (unless this run overwrites), removes one
/// whose replacement has written its first checkpoint, and under --overwrite (not resuming)
/// sets the earlier run aside. Logs what it moved.
void prepare_run_folder(const TrainConfig& c, bool resumes);

/// Rank 0, once a checkpoint of this run is written: removes the run --overwrite set aside.
void forget_overwritten_run(const std::string& out);

}  // namespace dtorch::train
