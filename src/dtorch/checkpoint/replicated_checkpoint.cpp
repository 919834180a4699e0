// Note [Saving replicated state]: each tensor of a replicated model written by one rank, read
// back by name.
#include "dtorch/checkpoint/replicated_checkpoint.h"

#include "dtorch/core/error.h"
#include "dtorch/core/torch_compat.h"
#include "dtorch/models/unit_seeds.h"
#include "dtorch/parallel/optimizer_state.h"

namespace dtorch::checkpoint {
namespace {

// A parameter's optimizer state; null when it has none yet (or there is no optimizer).
const torch::optim::OptimizerParamState* state_of(const torch::optim::Optimizer* opt,
                                                  const at::Tensor& p) {
  if (!opt) return nullptr;
  auto it = opt->state().find(compat::optimizer_state_key(p));
  return it == opt->state().end() ? nullptr : it->second.get();
}

int64_t bytes_of(const at::Tensor& t) {
  return t.numel() * static_cast<int64_t>(t.element_size());
}

}  // namespace

ReplicatedShare replicated_share(const CheckpointData& data, const torch::nn::Module& model,
                                 const torch::optim::Optimizer* optimizer, int rank, int world,
                                 bool copy) {
  auto kept = [copy](const at::Tensor& t) {
    at::Tensor flat = t.detach().reshape({-1});
    return copy ? host_snapshot(flat) : flat;
  };
  ReplicatedShare out;
  out.data.epoch = data.epoch;
  out.data.global_step = data.global_step;
  out.data.metadata_json = data.metadata_json;
  const auto params = model.named_parameters();
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> states;
  std::vector<int64_t> bytes;
  int64_t steps = 0;  // every parameter's, the same
  for (const auto& p : params) {
    const torch::optim::OptimizerParamState* st = state_of(optimizer, p.value());
    if (st && steps == 0) steps = parallel::steps_of(*st);
    states.push_back(st ? parallel::state_tensors(*st)
                        : std::vector<std::pair<std::string, at::Tensor>>{});
    int64_t b = bytes_of(p.value());
    for (const auto& [name, t] : states.back())
      b += bytes_of(t);
    bytes.push_back(b);
    out.data.layouts[p.key()] = {{p.key(), p.value().sizes().vec(), 0}};
  }
  const std::vector<int> writer = writers_by_bytes(bytes, world);
  for (size_t i = 0; i < params.size(); ++i) {
    if (writer[i] != rank) continue;
    const std::string& name = params[i].key();
    out.mine.push_back({"param/" + name, params[i].value().numel(), 0, kept(params[i].value())});
    for (const auto& [kind, t] : states[i])
      out.mine.push_back({str("optim/", name, "/", kind), t.numel(), 0, kept(t)});
  }
  if (rank == 0) {
    for (const auto& b : model.named_buffers())
      out.full.emplace_back("buffer/" + b.key(), copy ? host_snapshot(b.value()) : b.value());
    out.full.emplace_back("optim/step", torch::tensor({steps}, torch::kLong));
    out.full.emplace_back("rng_state", models::cpu_generator_state());
  }
  return out;
}

LoadedCheckpoint load_replicated(ShardedJoin& saved, torch::nn::Module& model,
                                 torch::optim::Optimizer* optimizer) {
  torch::NoGradGuard no_grad;
  const int64_t steps =
      saved.has_full("optim/step") ? saved.read_full("optim/step").item<int64_t>() : 0;
  for (auto& p : model.named_parameters()) {
    const std::string& name = p.key();
    const std::vector<int64_t> shape = p.value().sizes().vec();
    const auto found = saved.shape(name);
    DTORCH_CHECK_T(CheckpointError, found.has_value(), saved.dir(), " has no parameter ", name,
                   ": it was written for another model; use a new --out directory");
    DTORCH_CHECK_T(CheckpointError, *found == shape, saved.dir(), ": parameter ", name,
                   " has shape ", c10::IntArrayRef(*found), ", this model's is ",
                   c10::IntArrayRef(shape), "; it was written for another model configuration");
    const std::vector<FlatLayoutEntry> alone = {{name, shape, 0}};
    const int64_t n = p.value().numel();
    auto read = [&](const std::string& kind, const at::Tensor& into) {
      into.copy_(saved.read_range(alone, kind, 0, n, into.scalar_type()).view(into.sizes()));
    };
    read("param", p.value());
    if (!optimizer) continue;
    std::unique_ptr<torch::optim::OptimizerParamState> state =
        parallel::fresh_state(*optimizer, p.value());
    if (!state) continue;  // SGD without momentum keeps none
    const auto tensors = parallel::state_tensors(*state);
    if (tensors.empty()) continue;
    if (!saved.has_state(name, tensors.front().first)) {
      // A parameter that had no step before the save has no state in it, as here; state of
      // another optimizer is not this one's.
      for (const char* other : {"exp_avg", "momentum_buffer"})
        DTORCH_CHECK_T(CheckpointError, !saved.has_state(name, other), saved.dir(), " holds ",
                       other, " for ", name, ", the state of another optimizer than this run's; ",
                       "resume with the optimizer it was saved with, or start a new --out");
      continue;
    }
    for (const auto& [kind, t] : tensors)
      read("optim/" + kind, t);
    parallel::set_steps(*state, steps);
    optimizer->state()[compat::optimizer_state_key(p.value())] = std::move(state);
  }
  for (auto& b : model.named_buffers())
    b.value().copy_(saved.read_full("buffer/" + b.key()));
  if (saved.has_full("rng_state")) {
    // The generator of the stage that held this model's first parameter.
    const auto params = model.named_parameters();
    models::set_cpu_generator_state(
        saved.read_full("rng_state", params.is_empty() ? "" : params.keys().front()));
  }
  return {checkpoint_data(saved.data()), saved.dir()};
}

}  // namespace dtorch::checkpoint
