// The final model file (model_file.h).
#include "dtorch/train/model_file.h"

#include <set>
#include <string>
#include <vector>

#include "dtorch/checkpoint/checkpoint.h"
#include "dtorch/core/error.h"
#include "dtorch/core/log.h"

namespace dtorch::train {
namespace {

// The whole model's state on pp rank 0 from every stage's `stage` state of this pipeline (a
// parameter two stages hold, the tied embedding, taken once). Collective over the pp group.
checkpoint::StateDict join_pipeline_stages(pp::Pipeline& pipeline,
                                           const checkpoint::StateDict& stage) {
  comm::Communicator& g = pipeline.group();
  const std::vector<char> bytes = checkpoint::pickle_state_dict(stage);
  const std::string mine(bytes.begin(), bytes.end());
  checkpoint::StateDict full;
  std::set<std::string> seen;
  for (int r = 0; r < g.size(); ++r) {
    const std::string got =
        g.broadcast_string(r == g.rank() ? mine : std::string(), r, "pipeline stage state");
    if (g.rank() != 0) continue;
    for (auto& [name, t] : checkpoint::unpickle_state_dict(
             std::vector<char>(got.begin(), got.end()), str("stage ", r)))
      if (seen.insert(name).second) full.emplace_back(name, t);
  }
  return full;
}

}  // namespace

void write_model_file(const TrainConfig& c, Parallelized& run, comm::Communicator& world) {
  models::Model& model = *run.model;
  const tp::TensorParallel* tensor_parallel = run.layout.tp.handle.get();
  pp::Pipeline* pipeline = run.layout.pp.pipeline.get();
  const checkpoint::SaveFormat format = c.checkpointing.save_format;
  const std::string path = c.checkpointing.out + "/model" + checkpoint::file_suffix(format);
  // For torch.load the tied weights under Python's names too (Note [Tied embedding]).
  const auto aliased = [&](checkpoint::StateDict state) {
    return format == checkpoint::SaveFormat::Torch
               ? checkpoint::with_python_aliases(std::move(state), model.python_aliases())
               : state;
  };
  if (tensor_parallel || pipeline) {  // joined from the shards and stages, whole on rank 0
    auto whole = run.strategy->whole_parameters();
    checkpoint::StateDict full;
    if (tensor_parallel) {
      for (const auto& kv : tensor_parallel->full_state_dict(model))  // collective over tp
        full.emplace_back(kv.key(), kv.value());
    }
    if (pipeline && run.layout.dp->rank() == 0)
      full =
          join_pipeline_stages(*pipeline, tensor_parallel ? full : checkpoint::state_dict(model));
    if (world.rank() == 0)
      checkpoint::write_file_atomically(path,
                                        checkpoint::serialize_state_dict(aliased(full), format));
  } else if (world.rank() == 0) {  // gathered as it is written (Note [Model files written as...])
    const checkpoint::StateDict shapes =
        aliased(checkpoint::shapes_of(checkpoint::state_dict(model)));
    const auto fill = [&](const checkpoint::TakeTensor& take) {
      run.strategy->each_whole_parameter(take);
      for (const auto& b : model.named_buffers())
        take(b.key(), b.value());
    };
    if (auto why = dtorch::write_file_atomically(path, [&](const ByteSink& sink) {
          checkpoint::stream_state_dict(shapes, format, fill, sink);
        }))
      DTORCH_FAIL(CheckpointError, *why);
  } else {
    run.strategy->each_whole_parameter([](const std::string&, const torch::Tensor&) {});
  }
  if (world.rank() == 0)
    log::info("wrote ", path,
              format == checkpoint::SaveFormat::Torch
                  ? " (a state_dict for Python's torch.load)"
                  : " (safetensors: safetensors.torch.load_file)");
  world.barrier("model file written");
}

}  // namespace dtorch::train
