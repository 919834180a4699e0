// Optimizer state between tp shards and the whole model: the per-parameter state of the
// optimizers dtorch trains with (SGD's momentum, Adam's and AdamW's moments) is shaped like
// its parameter, so it splits and joins exactly as the parameter does.
#include "dtorch/parallel/tp/optimizer_state.h"

#include "dtorch/core/error.h"
#include "dtorch/core/torch_compat.h"
#include "dtorch/parallel/optimizer_state.h"

namespace dtorch::tp {
namespace {

// Calls f(name, from_param, to_param) for every parameter of `from` with optimizer state,
// in `from`'s order (the same on every rank).
template <class F>
void for_each_with_state(torch::nn::Module& from, const torch::optim::Optimizer& from_opt,
                         torch::nn::Module& to, F&& f) {
  auto to_params = to.named_parameters();
  for (const auto& kv : from.named_parameters()) {
    auto it = from_opt.state().find(compat::optimizer_state_key(kv.value()));
    if (it == from_opt.state().end()) continue;
    const torch::Tensor* target = to_params.find(kv.key());
    DTORCH_CHECK_T(ConfigError, target, "the other model has no parameter ", kv.key());
    f(kv.key(), *it->second, *target);
  }
}

}  // namespace

void gather_optimizer_state(const TensorParallel& tp, torch::nn::Module& local,
                            const torch::optim::Optimizer& local_opt, torch::nn::Module& full,
                            torch::optim::Optimizer& full_opt) {
  torch::NoGradGuard no_grad;
  const auto& group = tp.group();
  for_each_with_state(local, local_opt, full,
                      [&](const std::string& name, const auto& state, const torch::Tensor& to) {
                        auto spec = tp.sharded().find(name);
                        full_opt.state()[compat::optimizer_state_key(to)] =
                            parallel::map_state(state, [&](const torch::Tensor& t) {
                              if (spec == tp.sharded().end()) return t.clone();
                              std::vector<torch::Tensor> shards;
                              for (int r = 0; r < group->size(); ++r)
                                shards.push_back(torch::empty_like(t));
                              group->allgather(shards, t.contiguous(),
                                               "gathering optimizer state of " + name);
                              return unshard(shards, spec->second);
                            });
                      });
}

void shard_optimizer_state(const TensorParallel& tp, torch::nn::Module& full,
                           const torch::optim::Optimizer& full_opt, torch::nn::Module& local,
                           torch::optim::Optimizer& local_opt) {
  torch::NoGradGuard no_grad;
  const auto& group = tp.group();
  local_opt.state().clear();
  for_each_with_state(
      full, full_opt, local,
      [&](const std::string& name, const auto& state, const torch::Tensor& to) {
        auto spec = tp.sharded().find(name);
        local_opt.state()[compat::optimizer_state_key(to)] =
            parallel::map_state(state, [&](const torch::Tensor& t) {
              if (spec == tp.sharded().end()) return t.clone();
              return shard_of(t, spec->second, group->rank(), group->size()).clone();
            });
      });
}

}  // namespace dtorch::tp
