// ShardedModel set-up (Note [Sharding stages] in sharded_model.cpp): packs the model's parameters
// into flat units from rank 0's weights, or from a deferred model built again unit by unit, gives
// the optimizer this rank's shards, and installs the hooks that reduce and gather.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>

#include "dtorch/core/error.h"
#include "dtorch/core/freed_memory.h"
#include "dtorch/core/log.h"
#include "dtorch/models/model.h"
#include "dtorch/models/unit_seeds.h"
#include "dtorch/parallel/grad_ready.h"
#include "dtorch/parallel/model_sync.h"
#include "dtorch/parallel/zero/sharded_model_impl.h"

namespace dtorch::zero {

// ZeRO-3 on a model that names no units gathers all of it as one (Note [Your own model]).
void ShardedModel::Impl::warn_no_units(const std::vector<ParamInfo>& infos) const {
  if (comm->rank() != 0) return;
  int64_t numel = 0;
  for (const ParamInfo& p : infos)
    numel += p.numel;
  const double mib = double(numel) * double(c10::elementSize(opts.param_dtype)) / (1 << 20);
  const bool ours = dynamic_cast<const models::Model*>(module.get()) != nullptr;
  log::warn("ZeRO-3: the model names no units, so every rank holds all ", numel,
            " of its parameters (", std::round(mib * 10) / 10,
            " MiB) whenever it runs, as ZeRO-2 does: stage 3 saves no parameter memory here. ",
            ours ? "Its block_names() lists none; ZeRO-2 holds as much and gathers less"
                 : "Give it units: wrap it with models::wrap_module(model, policy) and run each "
                   "unit through models::call() in forward (docs/your-model.md)");
}

void ShardedModel::Impl::build(const OptimizerFactory& make_optimizer) {
  const std::string who = str("ZeRO-", opts.stage);
  DTORCH_CHECK_T(ConfigError, opts.stage >= 1 && opts.stage <= 3,
                 "ZeRO stage must be 1, 2 or 3 (got ", opts.stage, ")");
  DTORCH_CHECK_T(ConfigError,
                 opts.param_dtype == torch::kFloat || opts.param_dtype == torch::kBFloat16 ||
                     opts.param_dtype == torch::kHalf,
                 "parameter dtype must be float32, bfloat16 or float16");
  DTORCH_CHECK_T(ConfigError,
                 opts.reduce_dtype == torch::kFloat || opts.reduce_dtype == torch::kBFloat16 ||
                     opts.reduce_dtype == torch::kHalf,
                 "gradient reduction dtype must be float32, bfloat16 or float16");
  parallel::check_same_model(*module, *comm, who);
  if (replicas) parallel::check_same_model(*module, *replicas, who + " across replicas");
  // Note [Returning released memory]
  set_freed_memory(FreedMemory::Reuse);

  std::vector<ParamInfo> infos;
  for (const auto& kv : module->named_parameters()) {
    const at::Tensor& p = kv.value();
    DTORCH_CHECK_T(ConfigError, p.requires_grad(), who, ": parameter ", kv.key(),
                   " is frozen (requires_grad false); sharded training trains every parameter, "
                   "so register frozen weights as buffers instead");
    if (names.empty()) device = p.device();
    DTORCH_CHECK_T(ConfigError, p.scalar_type() == torch::kFloat && p.device() == device, who,
                   ": parameter ", kv.key(), " is ", p.scalar_type(), " on ", p.device(),
                   "; build the model in float32 on one device (set Options::param_dtype for "
                   "mixed precision)");
    names.push_back(kv.key());
    shapes.push_back(p.sizes().vec());
    params.push_back(p);
    infos.push_back({kv.key(), p.numel()});
  }
  for (const auto& b : module->buffers())
    buffers.push_back(b);

  auto* m = dynamic_cast<models::Model*>(module.get());
  const bool deferred = m && m->deferred();
  if (!sharded_params()) models::require_memory(*module, who);
  std::vector<std::string> blocks = m ? m->block_names() : std::vector<std::string>{};
  root_per_step = sharded_params() && m && m->scopes_forward();
  std::vector<UnitSpec> specs;
  if (sharded_params() && !blocks.empty()) {
    specs = units_by_blocks(infos, blocks, opts.min_unit_params);
    model = m;
  } else if (sharded_params()) {
    warn_no_units(infos);
    specs = {{"root", {}, {}}};  // no blocks: one unit, gathered per step if forward is scoped
    for (size_t i = 0; i < infos.size(); ++i)
      specs[0].params.push_back(i);
    if (root_per_step) model = m;
  } else {
    specs = units_by_size(infos, static_cast<int64_t>(opts.bucket_cap_mb * 1024 * 1024 / 4));
  }
  plan = make_plan(infos, specs, comm->size());
  // Each rank's offload files, named for the process and this model.
  static std::atomic<int> made{0};
  const int made_here = made++;
  auto swap_name = [&](const char* what) {
    return str("dtorch-", what, "-", ::getpid(), "-", made_here, "-rank", rank(), ".swap");
  };
  auto offload_on = [&](const char* what) {
    DTORCH_CHECK_T(ConfigError, device.is_cpu() || opts.state_on_host, what,
                   " can go to disk only from host memory, and this model computes on ", device,
                   ": keep the state on the host too (Options::state_on_host)");
  };
  if (!opts.param_offload.dir.empty()) {
    // Note [Parameters on disk]
    DTORCH_CHECK_T(ConfigError, sharded_params(), "the parameters go to disk at ZeRO stage 3, ",
                   "where each rank holds a shard of them (got stage ", opts.stage,
                   "): --strategy zero3");
    DTORCH_CHECK_T(ConfigError, !opts.optimizer_offload.dir.empty(),
                   "parameters on disk need the optimizer's state on disk too (--offload-optimizer "
                   "nvme): the step reads each shard's parameters in with its state, one shard "
                   "at a time");
    offload_on("the parameters");
    std::vector<int64_t> numels;
    for (const Unit& unit : plan.units)
      numels.push_back(unit.shard);
    OffloadOptions o = opts.param_offload;
    if (o.name.empty()) o.name = swap_name("params");
    params_on_disk = std::make_unique<ParamOffload>(numels, o);
  }

  const bool mixed = opts.param_dtype != torch::kFloat;
  torch::NoGradGuard no_grad;
  broadcast_from_first(buffers, who + " initial buffers");
  if (mixed) {
    // BatchNorm wants its running statistics in its input's dtype (FSDP's buffer_dtype).
    for (auto& b : buffers) {
      if (b.is_floating_point()) b.set_data(b.to(opts.param_dtype));
    }
  }
  // One unit at a time: pack rank 0's weights, point the parameters into the unit (which
  // frees their old storage) and, for stage 3, release it, so set-up never holds much more
  // than the model as it was built.
  units.resize(plan.units.size());
  for (size_t u = 0; u < plan.units.size(); ++u) {
    UnitState& s = units[u];
    if (deferred) {
      // Not touched: no memory on the CPU; released below, or as the next unit needs it.
      s.full = at::empty({plan.units[u].padded}, on(opts.param_dtype));
      // init_deferred fills it
      s.master = params_on_disk ? params_on_disk->slot(u)
                                : at::zeros({plan.units[u].shard}, on_state(at::kFloat));
    } else {
      at::Tensor flat = at::zeros({plan.units[u].padded}, on(at::kFloat));
      for (const UnitEntry& e : plan.units[u].entries)
        flat.narrow(0, e.offset, e.numel).copy_(params[e.param].detach().reshape({-1}));
      broadcast_from_first(flat, str(who, " initial weights of ", plan.units[u].name));
      s.full = mixed ? flat.to(opts.param_dtype) : flat;
      // Stages 1-2 in fp32 update the parameters' own chunk in place: no separate master.
      if (params_on_disk) {
        s.master = params_on_disk->slot(u).copy_(own(flat, u));
        evict_master(u);
      } else if (mixed || sharded_params() || opts.state_on_host) {
        s.master = at::empty({plan.units[u].shard}, on_state(at::kFloat)).copy_(own(flat, u));
      } else {
        s.master = own(s.full, u);
      }
    }
    if (opts.stage == 1) {
      s.grad_full = at::zeros({plan.units[u].padded}, s.full.options());
      s.grad_shard = mixed || opts.state_on_host
                         ? at::zeros({plan.units[u].shard}, on_state(at::kFloat))
                         : own(s.grad_full, u);
    } else {
      s.grad_shard = at::zeros({plan.units[u].shard}, on_state(at::kFloat));
    }
    s.master.mutable_grad() = s.grad_shard;
    for (const UnitEntry& e : plan.units[u].entries) {
      at::Tensor& p = params[e.param];
      p.mutable_grad().reset();
      p.set_data(s.full.narrow(0, e.offset, e.numel).view(shapes[e.param]));
    }
    gathered_bytes += bytes_of(s.full);
    if (model) release(u);
  }
  peak_gathered_bytes = gathered_bytes;  // what training holds, not the set-up
  if (deferred) init_deferred(*m);
  // The model as built, now packed into units (and for stage 3 released), is free memory the
  // heap would keep (Note [Returning released memory]).
  return_freed_memory();

  std::vector<at::Tensor> masters;
  for (auto& s : units)
    masters.push_back(s.master);
  optimizer = make_optimizer(masters);
  DTORCH_CHECK(optimizer, "the optimizer factory returned nothing");
  if (!opts.optimizer_offload.dir.empty()) {
    // Note [Optimizer state on disk]
    offload_on("the optimizer's state");
    OffloadOptions o = opts.optimizer_offload;
    if (o.name.empty()) o.name = swap_name("optimizer-state");
    offload = std::make_unique<OptimizerOffload>(*optimizer, masters, std::move(o));
  }

  install_readiness();
  if (model) install_block_hooks();
}

// Note [Deferred initialisation]: builds the model's units again, one at a time from rank 0's
// generator state, and copies the elements this rank owns into its masters; the units that
// stay gathered (the root of a model that does not scope its forward) then gather theirs.
void ShardedModel::Impl::init_deferred(const models::Model& m) {
  at::Tensor state = m.deferred_init().generator_state.clone();
  broadcast_from_first(state, "ZeRO-3 initial generator state");
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < names.size(); ++i)
    index[names[i]] = i;
  std::vector<bool> filled(names.size(), false);
  {
    models::GeneratorStateGuard keep;
    models::set_cpu_generator_state(state);
    m.deferred_init().for_each_unit([&](models::Model& built) {
      torch::NoGradGuard no_grad;
      for (const auto& kv : built.named_parameters()) {
        auto it = index.find(kv.key());
        DTORCH_CHECK(it != index.end(), "ZeRO-3: a unit of the deferred model has parameter ",
                     kv.key(), ", which the model itself does not");
        filled[it->second] = true;
        auto [u, k] = plan.where[it->second];
        const Unit& unit = plan.units[u];
        const UnitEntry& e = unit.entries[k];
        DTORCH_CHECK(kv.value().numel() == e.numel, "ZeRO-3: parameter ", kv.key(), " has ",
                     kv.value().numel(), " elements when built alone, ", e.numel, " in the model");
        // A parameter two units build (a GPT's tied embedding) gets the same values twice.
        auto [begin, end] = unit.owned(rank());
        const int64_t lo = std::max(begin, e.offset), hi = std::min(end, e.offset + e.numel);
        if (lo >= hi) continue;
        units[u]
            .master.narrow(0, lo - rank() * unit.shard, hi - lo)
            .copy_(kv.value().detach().reshape({-1}).narrow(0, lo - e.offset, hi - lo));
        evict_master(u);  // Note [Parameters on disk]
      }
    });
  }
  for (size_t i = 0; i < names.size(); ++i)
    DTORCH_CHECK(filled[i], "ZeRO-3: no unit of the deferred model built parameter ", names[i]);
  publish();
}

// Units are reduced strictly in reverse plan order on every rank (Note [Sharding stages]);
// a unit whose gradients never all arrive is reduced with zeros at the end of backward.
void ShardedModel::Impl::install_readiness() {
  std::vector<size_t> unit_of, order;
  for (const auto& w : plan.where)
    unit_of.push_back(w.first);
  for (size_t k = units.size(); k-- > 0;)
    order.push_back(k);
  parallel::GradReadiness::Policy policy;
  policy.who = str("ZeRO-", opts.stage);
  policy.fill_unused = true;
  policy.twice_hint = "run one backward per step (use no_sync() for gradient accumulation)";
  readiness = std::make_unique<parallel::GradReadiness>(
      params, names, std::move(unit_of), std::move(order), std::move(policy),
      parallel::GradReadiness::Callbacks{
          [this](size_t i) { absorb(i); }, [this](size_t u) { launch(u); },
          [this](size_t) { wait_reductions(); }, [this] { complete_reduction(); }});
}

void ShardedModel::Impl::install_block_hooks() {
  for (size_t u = 0; u < plan.units.size(); ++u) {
    const auto& bl = plan.units[u].blocks;
    if (bl.empty()) continue;
    block_first[bl.front()] = {u, true};
    block_last[bl.back()] = {u, true};
  }
  models::Model::BlockHooks hooks;
  hooks.before = [this](const std::string& b) { before_block(b); };
  hooks.after = [this](const std::string& b, at::Tensor out) { return after_block(b, out); };
  if (root_per_step) {
    hooks.forward_begin = [this] { before_forward(); };
    hooks.forward_end = [this](at::Tensor out) { return after_forward(out); };
  }
  model->set_block_hooks(hooks);
}

}  // namespace dtorch::zero
