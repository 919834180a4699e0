// Checkpoints of pipeline-parallel runs: one folder per stage and the stage layout, and a
// loader that takes any layout's parameters by name (Note [Pipeline checkpoints]).
#pragma once

#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtorch/checkpoint/checkpoint.h"
#include "dtorch/checkpoint/state_dict.h"
#include "dtorch/models/model.h"
#include "dtorch/parallel/pp/stage_plan.h"

namespace dtorch::checkpoint {

/// Note [Pipeline checkpoints]: under --pp, dp rank 0 of stage s writes its stage's
/// parameters (named as in the whole model) and their optimizer state to
/// <out>/pp<s>-of-<n>, and world rank 0 writes <out>/pipeline.json: the model and each
/// stage's units. Under DDP, resuming reads whichever layout the directory holds (the stage
/// folders, or one whole-model checkpoint) and takes each parameter its own units need, by
/// name, with its optimizer state, from the stage that holds it: any pp and dp resumes any
/// other, and `dtorch checkpoint consolidate` joins the stages. An interleaved rank writes
/// each of its stages to that stage's folder, so its checkpoints are the same. ZeRO's sharded
/// checkpoints hold all of a rank's stages in the folder of its first (pipeline.json's
/// "folders" then names the folder of every stage); they too resume at any pp, schedule and
/// dp, read by parameter name (Note [Resharding by name]), at the same --tp. DDP's saves that
/// its ranks share (Note [Saving replicated state]) take ZeRO's layout: the stage's dp ranks
/// (under --tp, dp rank 0's tp group, which holds the unsplit stage) each write a share of
/// the stage into the folder of the rank's first stage. DDP reads either, and ZeRO's shards
/// too, by name, and ZeRO reads DDP's shards.

/// "/pp<s>-of-<n>".
std::string pipeline_folder(int stage, int stages);

/// Writes <out>/pipeline.json for `plan` of `model`; `folders` (relative to `out`), when
/// given, names the folder that holds each stage (ZeRO keeps a rank's stages in one), else
/// stage s is in pipeline_folder(s, n).
void write_pipeline_layout(const std::string& out, const std::string& model,
                           const pp::StagePlan& plan, const std::vector<std::string>& folders = {});

/// Removes <out>/pipeline.json, once a run without a pipeline has saved in <out> itself:
/// its checkpoints are newer than the stage folders', which resuming would otherwise read.
void forget_pipeline_layout(const std::string& out);

/// The folder (relative to the run folder) that holds each of `stages` stages when each of
/// `ranks` pipeline ranks writes all of its stages as one sharded checkpoint into the folder
/// of its first: stage s is rank s % ranks's.
std::vector<std::string> folders_by_rank(int stages, int ranks);

/// A stage folder of a saved run and the units it holds.
struct SavedStage {
  std::string folder;
  models::UnitRange units;
};
/// The stages recorded in <out>/pipeline.json; empty when there is none.
std::vector<SavedStage> read_pipeline_layout(const std::string& out);

/// The folders of `out` whose saved stages overlap `units`, each once, in stage order: `out`
/// itself when it holds no pipeline.json (a run saved without a pipeline).
std::vector<std::string> folders_holding(const std::string& out, models::UnitRange units);

/// Fills `model` (any range of units) and `opt` from the newest checkpoints of `saved`:
/// builds each overlapping saved stage of `model_name` with an optimizer from
/// `make_optimizer`, loads it, and copies parameters, buffers and optimizer state by name.
/// nullopt when no stage folder has a checkpoint; CheckpointError when they disagree on the
/// epoch or leave a parameter of `model` unfilled.
std::optional<LoadedCheckpoint> load_from_stages(
    const std::vector<SavedStage>& saved, const std::string& model_name,
    const models::ImageInput& input, models::Model& model, torch::optim::Optimizer& opt,
    const std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)>&
        make_optimizer);

}  // namespace dtorch::checkpoint
