// The whole model of a run's checkpoint as one state dict, whatever layout wrote it.
#include "dtorch/checkpoint/consolidate.h"

#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>

#include "dtorch/checkpoint/pipeline_checkpoint.h"
#include "dtorch/checkpoint/sharded_checkpoint.h"
#include "dtorch/core/error.h"
#include "dtorch/core/input_file.h"
#include "dtorch/core/json_config.h"
#include "dtorch/core/paths.h"
#include "dtorch/parallel/tp/tensor_parallel.h"

namespace dtorch::checkpoint {
namespace {

// A ZeRO run with --tp N keeps one sharded checkpoint per tp index (Note [Tensor-parallel
// checkpoints] in train/strategy/ddp_strategy.cpp) and the split of each parameter in
// tensor_parallel.json: consolidate each, then join the tp slices.
StateDict consolidate_tensor_parallel(const std::string& dir, CheckpointData* data,
                                      std::string* source) {
  const std::string path = dir + "/tensor_parallel.json";
  nlohmann::json spec;
  int tp = 0;
  try {
    std::string why;
    if (!json_config::try_parse(read_input_file<CheckpointError>(path, "tensor-parallel layout"),
                                &spec, &why))
      throw std::runtime_error(why);
    tp = json_config::whole_number<int>(spec.at("tp"), "\"tp\"");
    if (tp < 1 || tp > 65536) throw std::runtime_error(str("\"tp\" is ", tp));
    for (const auto& [name, split] : spec.at("sharded").items()) {
      json_config::whole_number<int64_t>(split.at("dim"), "\"" + name + "\".dim");
      json_config::whole_number<int64_t>(split.at("fused"), "\"" + name + "\".fused");
    }
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::exception& e) {
    DTORCH_FAIL(CheckpointError, path, " is unreadable (", json_config::reason(e),
                "): restore it from the run that wrote the tp folders");
  }
  std::vector<std::map<std::string, torch::Tensor>> slices(tp);
  StateDict first;
  for (int i = 0; i < tp; ++i) {
    ShardedCheckpointReader reader(str(dir, "/tp", i, "-of-", tp));
    auto state = consolidate_model(reader);
    if (i == 0) {
      first = state;
      data->epoch = reader.data().epoch;
      data->global_step = reader.data().global_step;
      data->metadata_json = reader.data().metadata_json;
      *source = str(reader.dir(), " and its ", tp - 1, " tensor-parallel sibling(s)");
    }
    slices[i] = std::map<std::string, torch::Tensor>(state.begin(), state.end());
  }
  StateDict out;
  for (const auto& [name, t] : first) {
    auto it = spec.at("sharded").find(name);
    if (it == spec.at("sharded").end()) {
      out.emplace_back(name, t);
      continue;
    }
    std::vector<torch::Tensor> parts;
    for (int i = 0; i < tp; ++i) {
      DTORCH_CHECK_T(CheckpointError, slices[i].count(name), dir, "/tp", i, "-of-", tp, " has no ",
                     name);
      parts.push_back(slices[i][name]);
    }
    const int64_t dim = (*it)["dim"].get<int64_t>(), fused = (*it)["fused"].get<int64_t>();
    for (const auto& part : parts)
      DTORCH_CHECK_T(CheckpointError,
                     part.dim() == t.dim() && dim >= 0 && dim < t.dim() && fused >= 1 &&
                         part.size(dim) % fused == 0,
                     path, " splits ", name, " along dim ", dim, " in ", fused,
                     " fused part(s), which its slices of shape ", part.sizes(),
                     " do not allow: restore it from the run that wrote the tp folders");
    out.emplace_back(name, tp::unshard(parts, {dim, fused}));
  }
  return out;
}

// A pipeline run keeps one checkpoint per stage (Note [Pipeline checkpoints]): DDP's whole
// stage files, ZeRO's shards, or under --tp ZeRO's shards per tp index; each parameter is
// taken from the first stage holding it.
StateDict consolidate_pipeline(const std::vector<SavedStage>& stages, CheckpointData* data,
                               std::string* source) {
  StateDict out;
  std::set<std::string> seen, folders;
  for (size_t s = 0; s < stages.size(); ++s) {
    // ZeRO keeps an interleaved rank's stages in one folder: read it once.
    if (!folders.insert(stages[s].folder).second) continue;
    StateDict part;
    CheckpointData d;
    auto files = list_checkpoints(stages[s].folder);
    std::string unused;
    if (paths::exists(stages[s].folder + "/tensor_parallel.json")) {
      part = consolidate_tensor_parallel(stages[s].folder, &d, &unused);
    } else if (!files.empty()) {
      std::tie(part, d) = read_checkpoint_model(files.front());
    } else {
      ShardedCheckpointReader reader(stages[s].folder);
      part = consolidate_model(reader);
      d.epoch = reader.data().epoch;
      d.global_step = reader.data().global_step;
      d.metadata_json = reader.data().metadata_json;
    }
    DTORCH_CHECK_T(CheckpointError, s == 0 || d.epoch == data->epoch, stages[s].folder,
                   "'s newest checkpoint is from epoch ", d.epoch, " but stage 0's from epoch ",
                   data->epoch, ": the run stopped while saving; delete the newer ones");
    *data = d;
    for (auto& [name, t] : part)
      if (seen.insert(name).second) out.emplace_back(name, t);
  }
  *source = str(stages.size(), " pipeline stage folder(s) ", stages.front().folder, " ...");
  return out;
}

}  // namespace

Consolidated consolidate(const std::string& path) {
  Consolidated c;
  if (paths::exists(path + "/tensor_parallel.json")) {
    c.state = consolidate_tensor_parallel(path, &c.data, &c.source);
  } else if (auto stages = read_pipeline_layout(path); !stages.empty()) {
    c.state = consolidate_pipeline(stages, &c.data, &c.source);
  } else if (path.size() > 4 && path.compare(path.size() - 4, 4, ".dtc") == 0) {
    // A whole-model checkpoint (DDP's, tensor-parallel runs' included): its model as is.
    std::tie(c.state, c.data) = read_checkpoint_model(path);
    c.source = path;
  } else {
    ShardedCheckpointReader reader(path);
    c.state = consolidate_model(reader);
    c.source = reader.dir();
    c.data = checkpoint_data(reader.data());
  }
  return c;
}

}  // namespace dtorch::checkpoint
