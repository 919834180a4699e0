// parallelize() (parallelize.h): Note [Assembly order], step by step.
#include "dtorch/train/parallelize.h"

#include <algorithm>
#include <optional>

#include "dtorch/core/device.h"
#include "dtorch/core/error.h"
#include "dtorch/models/registry.h"
#include "dtorch/models/stage_union.h"
#include "dtorch/models/unit_seeds.h"
#include "dtorch/parallel/activation_checkpoint.h"
#include "dtorch/parallel/parallel_dims.h"

namespace dtorch::train {
namespace {

// This rank's stages of model `model_name` (Note [Pipeline units]), each from the same
// generator state (Note [Unit seeds]; the last leaves it as building one stage does), merged
// into a models::StageUnion when there are several.
std::shared_ptr<models::Model> build_stages(const std::string& model_name,
                                            const PipelineParallelism& pp,
                                            const models::ImageInput& input) {
  std::vector<std::shared_ptr<models::Model>> built;
  for (size_t k = 0; k < pp.stages.size(); ++k) {
    std::optional<models::GeneratorStateGuard> keep;
    if (k + 1 < pp.stages.size()) keep.emplace();
    built.push_back(models::make_model(model_name, pp.plan.stages[pp.stages[k]], input));
  }
  if (built.size() == 1) return built.front();
  return std::make_shared<models::StageUnion>(built);
}

// Step 1: the groups.
struct Groups {
  Layout layout;
  std::shared_ptr<comm::Communicator> tp, pp, cp;
};
Groups make_groups(const ParallelizeSpec& s, const std::shared_ptr<comm::Communicator>& world) {
  Groups g;
  const ParallelismConfig c =
      resolve_replicas(s.parallelism, world->size(), world->info().local_world_size);
  if (c.tp == 1 && c.pp == 1 && c.cp == 1 && c.dp_replicate == 1) {
    g.layout.dp = world;
    g.layout.plan = parallel::plan_mesh({0, 1}, world->size(), world->info().local_world_size);
    return g;
  }
  parallel::Mesh mesh =
      parallel::make_mesh(world, {0, c.tp, c.pp, c.cp, static_cast<int>(c.dp_replicate)});
  g.layout.dp = mesh.dp_cp;
  if (mesh.dp_replicate) g.layout.hybrid = {mesh.dp_shard, mesh.dp_replicate};
  g.layout.plan = mesh.plan;
  g.tp = mesh.tp;
  g.pp = mesh.pp;
  g.cp = mesh.cp;
  return g;
}

// Step 2 under a pipeline: the stage plan and this rank's stages.
std::shared_ptr<models::Model> build_rank_stages(const ParallelizeSpec& s, Groups& g) {
  const ParallelismConfig& c = s.parallelism;
  std::vector<std::string> names;
  std::vector<int64_t> sizes;
  for (const auto& u : models::model_units(s.model, s.input)) {
    names.push_back(u.name);
    sizes.push_back(u.parameters);
  }
  const int v = pp::default_virtual_stages(c.schedule);
  PipelineParallelism& out = g.layout.pp;
  out.plan = c.pp_split.empty() ? pp::balance_stages(sizes, c.pp * v)
                                : pp::split_stages_at(c.pp_split, names, sizes, c.pp * v);
  for (int k = 0; k < v; ++k)
    out.stages.push_back(g.pp->rank() + k * c.pp);
  return build_stages(s.model, out, s.input);
}

}  // namespace

Parallelized parallelize(const ParallelizeSpec& s, const std::shared_ptr<comm::Communicator>& world,
                         const std::function<void(const models::Model&)>& before_strategy) {
  const ParallelismConfig& c = s.parallelism;
  validate(c);
  DTORCH_CHECK_T(ConfigError, c.pp == 1 || c.microbatches >= 1, "parallelize: --pp ", c.pp,
                 " with microbatches 0: set the micro-batch count "
                 "(train::default_microbatches gives the one dtorch train would take)");
  Groups g = make_groups(s, world);
  Parallelized out;
  const bool pipelined = c.pp > 1;
  if (pipelined) {
    out.model = build_rank_stages(s, g);
  } else if (s.strategy.kind == StrategyKind::Zero3 || c.tp > 1) {
    out.model = models::make_deferred_model(s.model, s.input);  // Note [Deferred initialisation]
  } else {
    out.model = models::make_model(s.model, {}, s.input);
  }
  if (c.tp > 1) {
    g.layout.tp.handle =
        tp::parallelize(*out.model, g.tp, tp::plan_for(*out.model, c.tp), {c.sequence_parallel});
    // Checkpoints are written as the unsplit model (Note [Tensor-parallel checkpoints]).
    g.layout.tp.make_full_model = [name = s.model, pp = g.layout.pp, input = s.input,
                                   pipelined]() -> std::shared_ptr<models::Model> {
      return pipelined ? build_stages(name, pp, input) : models::make_model(name, {}, input);
    };
  }
  if (c.cp > 1) g.layout.cp = cp::parallelize(*out.model, g.cp, {c.cp_kind, c.tp});
  if (pipelined) {
    auto* merged = dynamic_cast<models::StageUnion*>(out.model.get());
    std::vector<std::shared_ptr<models::Model>> stages =
        merged ? merged->stages() : std::vector<std::shared_ptr<models::Model>>{out.model};
    g.layout.pp.pipeline = std::make_shared<pp::Pipeline>(
        stages, g.pp,
        pp::PipelineOptions{c.schedule, c.microbatches, pp::default_virtual_stages(c.schedule)});
  }
  models::to_device(*out.model, s.device);
  if (c.activation_checkpointing > 0) {
    DTORCH_CHECK_T(ConfigError, pipelined || !out.model->block_names().empty(),
                   "--activation-checkpointing: ", s.model,
                   " has no repeating blocks to recompute (gpt-*, vit-* and resnet* have); leave "
                   "the flag out");
    // A pipeline stage may hold no block (the embedding or the head alone): it recomputes
    // nothing.
    if (!out.model->block_names().empty())
      parallel::checkpoint_activations(*out.model, {c.activation_checkpointing});
  }
  if (before_strategy) before_strategy(*out.model);
  StrategyConfig sc = s.strategy;
  sc.model = s.model;
  sc.input = s.input;
  out.strategy =
      make_strategy(sc, out.model, g.layout.dp, g.layout.tp, g.layout.pp, g.layout.hybrid);
  out.layout = std::move(g.layout);
  return out;
}

}  // namespace dtorch::train
