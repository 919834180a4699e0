// Note [Pipeline checkpoints]: stage folders, pipeline.json, and loading any layout by name.
#include "dtorch/checkpoint/pipeline_checkpoint.h"

#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <iterator>
#include <set>

#include "dtorch/checkpoint/sharded_checkpoint.h"
#include "dtorch/core/error.h"
#include "dtorch/core/input_file.h"
#include "dtorch/core/json_config.h"
#include "dtorch/core/log.h"
#include "dtorch/core/paths.h"
#include "dtorch/core/torch_compat.h"
#include "dtorch/models/registry.h"

namespace dtorch::checkpoint {

std::string pipeline_folder(int stage, int stages) {
  return str("/pp", stage, "-of-", stages);
}

std::vector<std::string> folders_by_rank(int stages, int ranks) {
  std::vector<std::string> folders;
  for (int s = 0; s < stages; ++s)
    folders.push_back(pipeline_folder(s % ranks, stages));
  return folders;
}

void write_pipeline_layout(const std::string& out, const std::string& model,
                           const pp::StagePlan& plan, const std::vector<std::string>& folders) {
  nlohmann::json j = {{"model", model}, {"stages", nlohmann::json::array()}};
  for (const auto& r : plan.stages)
    j["stages"].push_back({r.begin, r.end});
  if (!folders.empty()) j["folders"] = folders;
  const std::string text = j.dump() + "\n";
  paths::create_directories(out);
  write_file_atomically(out + "/pipeline.json", std::vector<char>(text.begin(), text.end()));
}

void forget_pipeline_layout(const std::string& out) {
  std::error_code ec;
  paths::remove(out + "/pipeline.json", ec);
}

std::vector<SavedStage> read_pipeline_layout(const std::string& out) {
  const std::string path = out + "/pipeline.json";
  if (!paths::exists(path)) return {};
  std::vector<SavedStage> stages;
  try {
    nlohmann::json j;
    std::string why;
    if (!json_config::try_parse(read_input_file<CheckpointError>(path, "pipeline layout"), &j,
                                &why))
      throw std::runtime_error(why);
    const auto& list = j.at("stages");
    // Each stage is a folder of its own: more stages than ranks could ever run is damage.
    if (list.size() > 65536) throw std::runtime_error(str(list.size(), " stages"));
    for (size_t s = 0; s < list.size(); ++s) {
      const std::string folder =
          j.contains("folders")
              ? j["folders"].at(s).get<std::string>()
              : pipeline_folder(static_cast<int>(s), static_cast<int>(list.size()));
      stages.push_back({out + folder,
                        {json_config::whole_number<int>(list[s].at(0), "a stage's first unit"),
                         json_config::whole_number<int>(list[s].at(1), "a stage's end")}});
    }
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::exception& e) {
    DTORCH_FAIL(CheckpointError, path, " is unreadable (", json_config::reason(e),
                "): restore it from the run that wrote the stage folders, or start a new --out");
  }
  return stages;
}

std::vector<std::string> folders_holding(const std::string& out, models::UnitRange units) {
  std::vector<std::string> folders;
  for (const SavedStage& s : read_pipeline_layout(out)) {
    if (s.units.end <= units.begin || s.units.begin >= units.end) continue;
    if (std::find(folders.begin(), folders.end(), s.folder) == folders.end())
      folders.push_back(s.folder);
  }
  if (folders.empty()) folders.push_back(out);
  return folders;
}

namespace {

// The newest epoch of which every stage folder of `saved` holds a checkpoint file; nullopt when
// they share none. A run stopped while its stages saved leaves some folders an epoch ahead: every
// rank resumes from the epoch all of them hold (--keep-checkpoints 2, the default, keeps it), as
// each rank reads only the folders its units overlap.
std::optional<int64_t> epoch_of_every_stage(const std::vector<SavedStage>& saved) {
  std::optional<std::set<int64_t>> common;
  for (const SavedStage& s : saved) {
    std::set<int64_t> epochs;
    for (const std::string& f : list_checkpoints(s.folder))
      epochs.insert(checkpoint_epoch(f));
    if (!common) {
      common = epochs;
      continue;
    }
    std::set<int64_t> both;
    std::set_intersection(common->begin(), common->end(), epochs.begin(), epochs.end(),
                          std::inserter(both, both.begin()));
    common = both;
  }
  if (!common || common->empty()) return std::nullopt;
  return *common->rbegin();
}

}  // namespace

std::optional<LoadedCheckpoint> load_from_stages(
    const std::vector<SavedStage>& saved, const std::string& model_name,
    const models::ImageInput& input, models::Model& model, torch::optim::Optimizer& opt,
    const std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)>&
        make_optimizer) {
  const models::UnitRange mine = model.units();
  auto params = model.named_parameters();
  auto buffers = model.named_buffers();
  std::set<std::string> filled;
  std::optional<LoadedCheckpoint> result;
  torch::NoGradGuard no_grad;
  const std::optional<int64_t> epoch = epoch_of_every_stage(saved);
  const auto holds_nothing = [](const SavedStage& s) {
    return list_checkpoints(s.folder).empty() && list_sharded_checkpoints(s.folder).empty();
  };
  if (!epoch && std::any_of(saved.begin(), saved.end(), holds_nothing) &&
      !std::all_of(saved.begin(), saved.end(), holds_nothing)) {
    // Stopped during its first save: some stages wrote theirs, others not. Every rank sees
    // the same folders, so every rank starts afresh (and the next saves replace those files).
    log::warn("the stage folders of ", paths::parent_path(saved.front().folder),
              " share no epoch: the run stopped during its first save; starting from scratch");
    return std::nullopt;
  }
  for (const SavedStage& s : saved) {
    if (s.units.end <= mine.begin || s.units.begin >= mine.end) continue;
    if (list_checkpoints(s.folder).empty()) {
      // A run stopped before its first save leaves only its own files (config.json,
      // metrics.jsonl) there: it starts afresh. ZeRO's shards would be lost on the way.
      DTORCH_CHECK_T(CheckpointError,
                     list_sharded_checkpoints(s.folder).empty() &&
                         !paths::exists(s.folder + "/tensor_parallel.json"),
                     s.folder, " holds no whole-stage checkpoint but ZeRO's shards: resume with ",
                     "the --strategy, --pp and --pp-split that wrote it");
      DTORCH_CHECK_T(CheckpointError, !result, s.folder, " has no checkpoint but ", result->path,
                     " does: the run stopped while saving; remove the newer stage checkpoints ",
                     "or start a new --out");
      continue;
    }
    auto stage = models::make_model(model_name, s.units, input);
    auto stage_opt = make_optimizer(stage->parameters());
    auto loaded = load_latest_checkpoint(s.folder, *stage, stage_opt.get(), epoch);
    DTORCH_CHECK_T(CheckpointError, loaded, s.folder, " holds no checkpoint of epoch ",
                   epoch.value_or(0), " or before, which every other stage folder holds");
    DTORCH_CHECK_T(CheckpointError, !result || loaded->data.epoch == result->data.epoch,
                   loaded->path, " (epoch ", loaded->data.epoch, ") and ",
                   result ? result->path : "", " (epoch ", result ? result->data.epoch : 0,
                   ") are not from one save: the run stopped while saving; delete the newer ",
                   "ones to resume from the older epoch");
    for (const auto& kv : stage->named_parameters()) {
      torch::Tensor* to = params.find(kv.key());
      if (!to || filled.count(kv.key())) continue;
      to->copy_(kv.value());
      filled.insert(kv.key());
      auto state = stage_opt->state().find(compat::optimizer_state_key(kv.value()));
      if (state != stage_opt->state().end())
        opt.state()[compat::optimizer_state_key(*to)] = state->second->clone();
    }
    for (const auto& kv : stage->named_buffers())
      if (torch::Tensor* to = buffers.find(kv.key())) to->copy_(kv.value());
    result = loaded;
  }
  if (!result) return result;
  for (const auto& kv : params) {
    DTORCH_CHECK_T(CheckpointError, filled.count(kv.key()), "no stage checkpoint under ",
                   paths::parent_path(paths::parent_path(result->path)), " holds ", kv.key(),
                   ": it was written for another model");
  }
  return result;
}

}  // namespace dtorch::checkpoint
