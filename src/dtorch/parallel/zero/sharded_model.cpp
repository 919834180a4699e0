// ShardedModel: executes a ShardPlan (ZeRO stages 1-3) for one model: flat units, gradient
// reduce-scatter during backward, sharded optimizer step, and gathers (see zero.h).
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <map>

#include "dtorch/core/error.h"
#include "dtorch/core/freed_memory.h"
#include "dtorch/core/storage.h"
#include "dtorch/core/torch_compat.h"
#include "dtorch/models/model.h"
#include "dtorch/models/unit_seeds.h"
#include "dtorch/optim/fused.h"
#include "dtorch/parallel/grad_clip.h"
#include "dtorch/parallel/grad_ready.h"
#include "dtorch/parallel/model_sync.h"
#include "dtorch/parallel/optimizer_state.h"
#include "dtorch/parallel/zero/zero.h"

namespace dtorch::zero {

// Note [Sharding stages]
// Every stage packs the parameters into flat units (Note [Flat units]) whose slices the
// parameters become (Tensor::set_data onto views), and gives the optimizer one fp32 "master"
// tensor per unit: this rank's shard. What differs is what stays whole:
//   stage 1: parameters and gradients whole. Gradients accumulate into a flat buffer the
//     parameters' .grad alias; on the synchronised backward each unit is reduce-scattered in
//     place, so this rank's chunk of that buffer is its gradient shard. fp32 masters are views
//     of the rank's chunk of the parameters: 4P + 4P + 8P/N bytes with AdamW.
//   stage 2: gradients are never whole for long: when a unit's last gradient arrives its
//     gradients are copied into a bucket, released, and the bucket is reduce-scattered while
//     backward goes on; the result is added to a persistent fp32 gradient shard.
//     4P + 12P/N. Under accumulate_whole() (a pipeline's micro-batches) the gradients stay
//     whole in .grad until reduce_accumulated() moves them into buckets once: + 4P meanwhile.
//   stage 3: parameters sharded too. Masters are separate fp32 shards; a unit's full buffer
//     is allocated and all-gathered just before its first block runs (the next unit's gather
//     prefetched) and its memory released after its last block, then gathered again when
//     backward reaches it (an identity autograd function on the unit's output triggers
//     that) and released once its gradients are reduced. 16P/N + the gathered units.
//     The root unit (parameters outside blocks: a GPT's embeddings, final norm and tied
//     head) is used at both ends of forward. For a model that scopes its forward
//     (Model::scopes_forward) it is gathered as forward begins, kept through forward and
//     backward, and released once its gradients are reduced, as FSDP keeps its root: per
//     step it is gathered once, not twice, and nothing is gathered between steps or during
//     the optimizer step. Options::reshard_root_after_forward releases it after forward and
//     gathers it again as backward begins, which sends the paper's 3x bytes and frees it only
//     while the loss is computed. A model that does not scope its forward keeps its root
//     gathered all the time, updated by step().
// Units are reduced strictly in reverse plan order on every rank (backward produces the
// last units' gradients first), so collectives match across ranks; a unit whose gradients
// never all arrive (unused parameters) is reduced with zeros at the end of backward.
// Releasing keeps each parameter's TensorImpl (autograd has saved it) but gives its storage
// zero bytes; gathering gives the same storage fresh memory, so the saved tensors see the
// gathered values again (this is what FSDP does with storage().resize_()).
// Note [Spare unit memory]: a gathered unit's memory and a stage 3 unit's gradient bucket are the
// same sizes every step (every block of a GPT is), and with the allocator returning large buffers
// to the kernel (Note [Returning released memory]) each gather and each bucket page-faulted its
// memory in afresh: gpt-small at 2 ranks gathers 24 and buckets 12 units of 28 MiB a step. The
// most recently released of each are kept and handed to the next of the same size instead.
// gpt-small at 2 ranks (LibTorch 2.15, 4 steps, interleaved runs): 0.51-0.53 samples/s without,
// 0.63-0.70 with two kept; peak RSS per rank 2.17-2.18 and 2.25-2.26 GiB. Two still left about
// three units' memory to fault in every step (the root unit, of another size, pushed a block's
// out): with four kept, gpt-small at 2 ranks (LibTorch 2.15, 3 steps after 3) faults 0 pages a
// step where it faulted 20.8k, and steps in 1.39 s where it took 1.70 s; peak RSS per rank 2.30
// GiB with either.
// Note [Gradient buckets of stage 2]: stage 2 holds its parameters whole, so what it frees
// each step is what the next step needs again, and the heap keeps it (Note [Returning released
// memory]) as long as no buffer is above glibc's 32 MiB mmap threshold. Its units close before
// the bucket cap (25 MiB by default), so every bucket of several parameters comes from the
// heap; a parameter above the cap (a GPT's token embedding, 154 MiB at gpt-small) is a unit of
// its own, and its gradient is its bucket as backward left it, no copy; and the first
// reduction after zero_grad() writes the shard directly, no `incoming` buffer. Before, stage 2
// took its buckets from mappings of its own, as stage 3 must, and the spares rarely matched
// units of varying sizes: gpt-small at 2 ranks (LibTorch 2.15, 5 steps after 2) faulted 236k
// pages a step (ZeRO-1 151k) and ran 1.59-1.65 s a step (ZeRO-1 1.44-1.56 s in the same
// runs); now 133k-148k and 1.40-1.50 s (ZeRO-1 1.39-1.49 s); peak RSS per rank 2.19 GiB then,
// 2.12 GiB now.
// A model built without memory (Note [Deferred initialisation]) has no weights to pack: its
// units' full buffers are allocated and released untouched, and each rank fills its masters
// from the model's units built again one at a time (init_deferred).

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

int64_t bytes_of(const at::Tensor& t) {
  return t.defined() ? static_cast<int64_t>(t.nbytes()) : 0;
}

}  // namespace

// Note [Spare unit memory]: the four most recently released buffers (unit memory, or gradient
// buckets), each with its size in bytes. Outside the anonymous namespace: Impl holds two.
template <class T>
class Spares {
 public:
  void put(size_t nbytes, T buffer) {
    kept_.emplace_back(nbytes, std::move(buffer));
    if (kept_.size() > 4) kept_.pop_front();
  }
  /// A kept buffer of `nbytes`, or an empty T when there is none.
  T take(size_t nbytes) {
    for (auto it = kept_.begin(); it != kept_.end(); ++it) {
      if (it->first != nbytes) continue;
      T buffer = std::move(it->second);
      kept_.erase(it);
      return buffer;
    }
    return T();
  }

 private:
  std::deque<std::pair<size_t, T>> kept_;
};

struct ShardedModel::Impl {
  struct UnitState {
    at::Tensor full;        // [padded], param dtype; the parameters are views of it
    at::Tensor master;      // [shard] fp32: the optimizer's parameter
    at::Tensor grad_shard;  // [shard] fp32: the master's gradient
    at::Tensor grad_full;   // stage 1: [padded], param dtype; .grad of the parameters alias it
    at::Tensor bucket;      // stages 2-3, during backward: gradients to reduce (reduce dtype)
    at::Tensor incoming;    // stages 2-3, during backward: this rank's reduced chunk
    comm::Work reduce, gather;
    bool materialized = true;
    bool shard_zeroed = true;  // grad_shard holds zeros: a reduction may write it directly
  };

  std::shared_ptr<torch::nn::Module> module;
  models::Model* model = nullptr;  // set when the module has blocks (stage 3 hooks)
  std::shared_ptr<comm::Communicator> comm;
  Options opts;
  ShardPlan plan;
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<at::Tensor> params, buffers;
  at::Device device = at::kCPU;  // where the parameters are, and every buffer made for them
  std::vector<UnitState> units;
  // Stages 2-3: units whose reduce-scatter is launched and not yet added to the shard, oldest
  // first (Note [Buckets in flight]).
  std::deque<size_t> in_flight;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::map<std::string, std::pair<size_t, bool>> block_first, block_last;  // block -> unit
  // Reduces units as backward completes them (Note [Gradient readiness]); made last in
  // build(), reset first on destruction.
  std::unique_ptr<parallel::GradReadiness> readiness;
  bool keep_gathered = false;
  // Note [ZeRO-3 under a pipeline]: the units stay gathered; or, each unit is released when
  // backward enters the next one (left_in_backward: the unit it entered last).
  bool hold_for_microbatches = false;
  bool release_in_backward = false;
  size_t left_in_backward = 0;
  bool root_per_step = false;  // the model scopes its forward: the root is gathered per step
  int64_t gathered_bytes = 0, peak_gathered_bytes = 0;
  WaitSeconds waited;
  Spares<at::DataPtr> spare_memory;  // Note [Spare unit memory]
  Spares<at::Tensor> spare_buckets;

  int rank() const { return comm->rank(); }
  at::TensorOptions on(at::ScalarType dtype) const {
    return at::TensorOptions().dtype(dtype).device(device);
  }
  bool sharded_params() const { return opts.stage == 3; }
  // Stage 3's gradient buckets on a CPU live in mappings of their own, two of them kept (Note
  // [Spare unit memory]); a GPU's caching allocator keeps freed memory itself.
  bool mapped_buckets() const { return sharded_params() && device.is_cpu(); }
  // The root of a model that does not scope its forward (Note [Sharding stages]).
  bool always_gathered(size_t u) const {
    return sharded_params() && !root_per_step && plan.units[u].name == "root";
  }
  at::Tensor own(const at::Tensor& flat, size_t u) const {
    return flat.narrow(0, rank() * plan.units[u].shard, plan.units[u].shard);
  }

  void build(const OptimizerFactory& make_optimizer);
  void init_deferred(const models::Model& m);
  void publish();
  void install_block_hooks();
  void install_readiness();
  void absorb(size_t i);
  void launch(size_t u);
  void wait_reductions();
  void finish_reduction(UnitState& s);
  void complete_reduction();
  void gather_async(size_t u);
  void ensure_gathered(size_t u);
  void release(size_t u);
  void wait_for(comm::Work& w, double& seconds);
  at::Tensor zeroed_bucket(size_t u);
  bool owns_whole_unit(const at::Tensor& g, size_t u) const;
  void before_block(const std::string& block);
  at::Tensor after_block(const std::string& block, at::Tensor out);
  void before_forward();
  at::Tensor after_forward(at::Tensor out);
  void before_unit_backward(size_t u);
};

namespace {

// Identity in forward; in backward, tells the model that backward is about to enter unit
// `u` so its parameters are gathered first (Note [Sharding stages]).
struct PreBackward : public torch::autograd::Function<PreBackward> {
  static at::Tensor forward(AutogradContext* ctx, at::Tensor x, int64_t impl, int64_t unit) {
    ctx->saved_data["impl"] = impl;
    ctx->saved_data["unit"] = unit;
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* impl = reinterpret_cast<ShardedModel::Impl*>(ctx->saved_data["impl"].toInt());
    impl->before_unit_backward(static_cast<size_t>(ctx->saved_data["unit"].toInt()));
    return {grads[0], at::Tensor(), at::Tensor()};
  }
};

}  // namespace

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
    specs = {{"root", {}, {}}};  // no blocks: one unit, gathered per step if forward is scoped
    for (size_t i = 0; i < infos.size(); ++i)
      specs[0].params.push_back(i);
    if (root_per_step) model = m;
  } else {
    specs = units_by_size(infos, static_cast<int64_t>(opts.bucket_cap_mb * 1024 * 1024 / 4));
  }
  plan = make_plan(infos, specs, comm->size());

  const bool mixed = opts.param_dtype != torch::kFloat;
  torch::NoGradGuard no_grad;
  parallel::broadcast_from_rank0(buffers, *comm, who + " initial buffers");
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
      s.master = at::zeros({plan.units[u].shard}, on(at::kFloat));  // init_deferred fills it
    } else {
      at::Tensor flat = at::zeros({plan.units[u].padded}, on(at::kFloat));
      for (const UnitEntry& e : plan.units[u].entries)
        flat.narrow(0, e.offset, e.numel).copy_(params[e.param].detach().reshape({-1}));
      comm->broadcast(flat, 0, str(who, " initial weights of ", plan.units[u].name));
      s.full = mixed ? flat.to(opts.param_dtype) : flat;
      // Stages 1-2 in fp32 update the parameters' own chunk in place: no separate master.
      s.master = (mixed || sharded_params()) ? own(flat, u).clone() : own(s.full, u);
    }
    if (opts.stage == 1) {
      s.grad_full = at::zeros({plan.units[u].padded}, s.full.options());
      s.grad_shard = mixed ? at::zeros({plan.units[u].shard}, on(at::kFloat)) : own(s.grad_full, u);
    } else {
      s.grad_shard = at::zeros({plan.units[u].shard}, on(at::kFloat));
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

  install_readiness();
  if (model) install_block_hooks();
}

// Note [Deferred initialisation]: builds the model's units again, one at a time from rank 0's
// generator state, and copies the elements this rank owns into its masters; the units that
// stay gathered (the root of a model that does not scope its forward) then gather theirs.
void ShardedModel::Impl::init_deferred(const models::Model& m) {
  at::Tensor state = m.deferred_init().generator_state.clone();
  comm->broadcast(state, 0, "ZeRO-3 initial generator state");
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

// The root unit is unit 0 (units_by_blocks); Note [Sharding stages].
void ShardedModel::Impl::before_forward() {
  ensure_gathered(0);
  if (opts.prefetch && units.size() > 1) gather_async(1);
}

at::Tensor ShardedModel::Impl::after_forward(at::Tensor out) {
  if (!out.requires_grad()) {  // no backward follows (evaluation)
    release(0);
    return out;
  }
  out = PreBackward::apply(out, reinterpret_cast<int64_t>(this), 0);
  if (opts.reshard_root_after_forward) release(0);
  return out;
}

void ShardedModel::Impl::before_block(const std::string& block) {
  auto it = block_first.find(block);
  if (it == block_first.end()) return;
  size_t u = it->second.first;
  ensure_gathered(u);
  if (opts.prefetch && u + 1 < units.size()) gather_async(u + 1);
}

at::Tensor ShardedModel::Impl::after_block(const std::string& block, at::Tensor out) {
  auto it = block_last.find(block);
  if (it == block_last.end()) return out;
  size_t u = it->second.first;
  if (out.requires_grad()) {
    out = PreBackward::apply(out, reinterpret_cast<int64_t>(this), static_cast<int64_t>(u));
  }
  release(u);
  return out;
}

// Backward runs the root's last use first (a GPT's head), then the units in reverse.
void ShardedModel::Impl::before_unit_backward(size_t u) {
  if (release_in_backward) {  // Note [ZeRO-3 under a pipeline]
    if (left_in_backward != 0 && left_in_backward < units.size() && left_in_backward != u) {
      release(left_in_backward);
    }
    left_in_backward = u;
  }
  ensure_gathered(u);
  const size_t next = u == 0 ? units.size() - 1 : u - 1;
  if (opts.prefetch && next != u) gather_async(next);
}

void ShardedModel::Impl::gather_async(size_t u) {
  UnitState& s = units[u];
  if (s.materialized) return;
  const size_t nbytes = static_cast<size_t>(bytes_of(s.full));
  at::DataPtr memory = spare_memory.take(nbytes);  // Note [Spare unit memory]
  // A GPU's caching allocator already keeps freed memory (Note [Returning released memory]).
  if (!memory && device.is_cpu()) memory = map_memory(nbytes);
  restore_storage(s.full, nbytes, std::move(memory));
  s.materialized = true;
  gathered_bytes += bytes_of(s.full);
  peak_gathered_bytes = std::max(peak_gathered_bytes, gathered_bytes);
  torch::NoGradGuard no_grad;
  at::Tensor mine = own(s.full, u);
  mine.copy_(s.master);
  s.gather = comm->allgather_into_async(s.full, mine, str("ZeRO-3 gather of ", plan.units[u].name));
}

void ShardedModel::Impl::ensure_gathered(size_t u) {
  gather_async(u);
  wait_for(units[u].gather, waited.gather);
}

void ShardedModel::Impl::wait_for(comm::Work& w, double& seconds) {
  if (!w.valid()) return;
  const auto t0 = std::chrono::steady_clock::now();
  w.wait();
  seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  w = comm::Work();
}

void ShardedModel::Impl::release(size_t u) {
  UnitState& s = units[u];
  if (!sharded_params() || always_gathered(u) || keep_gathered || hold_for_microbatches ||
      !s.materialized) {
    return;
  }
  wait_for(s.gather, waited.gather);
  const size_t nbytes = static_cast<size_t>(bytes_of(s.full));
  spare_memory.put(nbytes, release_storage(s.full));  // Note [Spare unit memory]
  s.materialized = false;
  gathered_bytes -= static_cast<int64_t>(nbytes);
}

// Moves parameter i's gradient into its unit's buffer (a missing gradient counts as zeros).
void ShardedModel::Impl::absorb(size_t i) {
  auto [u, k] = plan.where[i];
  UnitState& s = units[u];
  const UnitEntry& e = plan.units[u].entries[k];
  at::Tensor& g = params[i].mutable_grad();
  torch::NoGradGuard no_grad;
  if (opts.stage == 1) {
    at::Tensor view = s.grad_full.narrow(0, e.offset, e.numel).view(shapes[i]);
    if (g.defined() && !g.is_same(view)) view.copy_(g);
    return;
  }
  if (!s.bucket.defined() && owns_whole_unit(g, u)) {
    s.bucket = g.view({-1});  // Note [Gradient buckets of stage 2]
  } else {
    if (!s.bucket.defined()) s.bucket = zeroed_bucket(u);
    if (g.defined()) s.bucket.narrow(0, e.offset, e.numel).copy_(g.reshape({-1}));
  }
  g.reset();  // the bucket has it; free it now rather than after backward
}

void ShardedModel::Impl::launch(size_t u) {
  UnitState& s = units[u];
  const Unit& unit = plan.units[u];
  std::string what = str("ZeRO-", opts.stage, " gradients of ", unit.name);
  if (opts.stage == 1) {
    const bool same = s.grad_full.scalar_type() == opts.reduce_dtype;
    at::Tensor in = same ? s.grad_full : s.grad_full.to(opts.reduce_dtype);
    if (s.grad_shard.is_alias_of(in)) {  // fp32 throughout: reduce in place
      s.reduce = comm->reduce_scatter_async(in, s.grad_shard, comm::ReduceOp::Avg, what);
    } else {
      s.bucket = in;
      s.incoming = at::empty({unit.shard}, on(opts.reduce_dtype));
      s.reduce = comm->reduce_scatter_async(in, s.incoming, comm::ReduceOp::Avg, what);
    }
    return;
  }
  if (!s.bucket.defined()) s.bucket = zeroed_bucket(u);
  // Note [Gradient buckets of stage 2]: the first reduction after zero_grad() writes the shard.
  const bool direct = s.shard_zeroed && opts.reduce_dtype == at::kFloat;
  s.shard_zeroed = false;
  if (!direct) s.incoming = at::empty({unit.shard}, on(opts.reduce_dtype));
  s.reduce = comm->reduce_scatter_async(s.bucket, direct ? s.grad_shard : s.incoming,
                                        comm::ReduceOp::Avg, what);
  release(u);  // backward is done with this unit's parameters (Note [Sharding stages])
  // Note [Buckets in flight]: a launched unit's bucket (the whole unit's gradient) lives until
  // its reduce-scatter is added to the shard. Waiting for all of them at the end of backward
  // kept a whole model's gradient alive at once, whatever the rank count (gpt-large at 2
  // ranks: 4.9 GiB of backward peak, 11.5 GiB peak RSS per rank); finishing all but the last
  // two as backward goes on keeps two buckets (1.2 GiB, 7.9 GiB), and the wait costs nothing:
  // the single communication worker finishes reductions in launch order anyway.
  in_flight.push_back(u);
  while (in_flight.size() > 2) {
    finish_reduction(units[in_flight.front()]);
    in_flight.pop_front();
  }
}

void ShardedModel::Impl::finish_reduction(UnitState& s) {
  torch::NoGradGuard no_grad;
  wait_for(s.reduce, waited.reduce);
  if (s.incoming.defined()) {
    s.grad_shard.add_(s.incoming);
    s.incoming = at::Tensor();
  }
  // Note [Spare unit memory]; stage 1's bucket is a dtype copy of its whole gradient, stage 2's
  // came from the heap (Note [Gradient buckets of stage 2]).
  if (s.bucket.defined() && mapped_buckets()) spare_buckets.put(bytes_of(s.bucket), s.bucket);
  s.bucket = at::Tensor();
}

// A zeroed gradient bucket for unit u: stage 3's on a CPU is a spare one of its size when there
// is one, else a mapping of its own; stage 2's comes from the heap (Note [Gradient buckets of
// stage 2]), a GPU's from its caching allocator.
at::Tensor ShardedModel::Impl::zeroed_bucket(size_t u) {
  const int64_t n = plan.units[u].padded;
  if (!mapped_buckets()) return at::zeros({n}, on(opts.reduce_dtype));
  at::Tensor b = spare_buckets.take(n * c10::elementSize(opts.reduce_dtype));
  return b.defined() ? b.zero_() : mapped_zeros(n, opts.reduce_dtype);
}

// Whether gradient `g` can be unit u's bucket as it is: the unit's one parameter, in the
// reduction's dtype, filling the unit, and its memory seen by no tensor that outlives the
// hook (the reduction may use it as scratch). AccumulateGrad makes .grad a detached alias of
// backward's result, which the engine holds as the hook's input until the hook returns: two.
bool ShardedModel::Impl::owns_whole_unit(const at::Tensor& g, size_t u) const {
  const Unit& unit = plan.units[u];
  return g.defined() && unit.entries.size() == 1 && unit.padded == g.numel() &&
         g.scalar_type() == opts.reduce_dtype && g.is_contiguous() && g.storage_offset() == 0 &&
         g.storage().use_count() <= 2;
}

// Every unit was launched (unused parameters are reduced as zeros).
void ShardedModel::Impl::wait_reductions() {
  in_flight.clear();
  for (size_t k = 0; k < units.size(); ++k)
    finish_reduction(units[units.size() - 1 - k]);
}

void ShardedModel::Impl::complete_reduction() {
  if (opts.stage == 1) {
    for (size_t i = 0; i < params.size(); ++i) {
      auto [u, k] = plan.where[i];
      const UnitEntry& e = plan.units[u].entries[k];
      at::Tensor& g = params[i].mutable_grad();
      at::Tensor view = units[u].grad_full.narrow(0, e.offset, e.numel).view(shapes[i]);
      if (!g.defined() || !g.is_same(view)) g = view;
    }
  }
  for (size_t u = 0; u < units.size(); ++u)
    release(u);
  if (opts.broadcast_buffers && !buffers.empty()) {
    parallel::broadcast_from_rank0(buffers, *comm, str("ZeRO-", opts.stage, " buffers"));
  }
}

// ---- ShardedModel ------------------------------------------------------------------------

ShardedModel::ShardedModel(std::shared_ptr<torch::nn::Module> model,
                           std::shared_ptr<comm::Communicator> comm, Options opts,
                           const OptimizerFactory& make_optimizer)
    : impl_(std::make_unique<Impl>()) {
  impl_->module = std::move(model);
  impl_->comm = std::move(comm);
  impl_->opts = opts;
  impl_->build(make_optimizer);
}

ShardedModel::~ShardedModel() {
  impl_->readiness.reset();
  if (impl_->model) impl_->model->set_block_hooks({});
  for (auto& s : impl_->units) {
    s.reduce.wait();
    s.gather.wait();
  }
}

// Note [ZeRO-3 under a pipeline]
// A pipeline runs every micro-batch's forward and backward of a step before the strategy
// reduces (accumulate_whole, then reduce_accumulated), and a 1F1B schedule interleaves them:
// micro-batch 2's forward runs before micro-batch 1's backward. Under the guard stage 3
// accumulates whole gradients in .grad as stage 2 does, because the pipeline sums a tied
// parameter's gradients across stages after the last backward, and reduces them once, unit by
// unit, in reduce_accumulated, each unit released as its reduction starts. What it does with
// the parameters meanwhile is chosen by Options::reshard_after_microbatch:
//   off (the default; torchtitan runs FSDP under a pipeline without resharding after forward):
//     every unit of the rank's stages is gathered as the guard is made and stays gathered.
//     One gather of every unit per step, whatever the micro-batch count; held: the stages'
//     parameters and gradients whole (ZeRO-2's bytes under a pipeline, plus the parameters in
//     the compute dtype).
//   on: a unit is gathered before its blocks run and released after them, gathered again when
//     a micro-batch's backward reaches it and released when backward enters the unit before
//     it (whose output the backward of every later unit has then consumed; the root unit is
//     kept until the reduction). Two gathers of every unit per micro-batch; held: the whole
//     gradients and the units in use. It relies on the block hooks and PreBackward firing as
//     each micro-batch's backward goes through the stage, which a schedule that splits
//     backward (zb) or runs several stages per rank (interleaved: the hooks sit on the stages'
//     union) does not give; the run configuration refuses those.
ShardedModel::NoSync::NoSync(ShardedModel* m, bool whole) : m_(m) {
  Impl& impl = *m_->impl_;
  DTORCH_CHECK(impl.readiness->sync(), "no_sync() guards must not nest");
  // Stages 2-3 reduce every backward (Note [Sharding stages]) unless asked to hold whole
  // gradients; stage 3 then also keeps or releases its units by Options (Note [ZeRO-3 under a
  // pipeline]).
  if (impl.opts.stage == 3 && whole && impl.opts.reshard_after_microbatch) {
    impl.left_in_backward = impl.units.size();
    impl.release_in_backward = true;
  } else if (impl.opts.stage == 3 && whole) {
    for (size_t u = 0; u < impl.units.size(); ++u)
      impl.gather_async(u);
    for (size_t u = 0; u < impl.units.size(); ++u)
      impl.ensure_gathered(u);
    impl.hold_for_microbatches = true;
  }
  if (impl.opts.stage == 1 || whole) impl.readiness->set_sync(false);
}

ShardedModel::NoSync::~NoSync() {
  if (!m_) return;
  m_->impl_->readiness->set_sync(true);
  m_->impl_->hold_for_microbatches = false;
  m_->impl_->release_in_backward = false;
}

ShardedModel::NoSync ShardedModel::no_sync() {
  return NoSync(this, false);
}

ShardedModel::NoSync ShardedModel::accumulate_whole() {
  return NoSync(this, true);
}

void ShardedModel::reduce_accumulated() {
  impl_->readiness->reduce_accumulated();
}

ShardedModel::FullParams::FullParams(ShardedModel* m) : m_(m) {
  auto& impl = *m_->impl_;
  for (size_t u = 0; u < impl.units.size(); ++u)
    impl.gather_async(u);
  for (size_t u = 0; u < impl.units.size(); ++u)
    impl.ensure_gathered(u);
  impl.keep_gathered = true;
}

ShardedModel::FullParams::~FullParams() {
  auto& impl = *m_->impl_;
  impl.keep_gathered = false;
  for (size_t u = 0; u < impl.units.size(); ++u)
    impl.release(u);
}

ShardedModel::FullParams ShardedModel::full_params() {
  return FullParams(this);
}

at::Tensor ShardedModel::clip_grad_norm(double max_norm, const NormScope& scope) {
  DTORCH_CHECK_T(ConfigError, max_norm > 0, "clip-grad-norm must be positive (got ", max_norm, ")");
  auto& impl = *impl_;
  at::Tensor sq = parallel::sum_of_squares(gradient_shards(), impl.on(at::kDouble).device());
  for (size_t u = 0; u < impl.units.size() && !scope.counted_elsewhere.empty(); ++u) {
    // Take out the owned elements of parameters counted elsewhere.
    const at::Tensor& g = impl.units[u].grad_shard;
    const Unit& unit = impl.plan.units[u];
    auto [begin, end] = unit.owned(impl.rank());
    for (const auto& e : unit.entries) {
      if (!scope.counted_elsewhere.count(impl.names[e.param])) continue;
      const int64_t lo = std::max(begin, e.offset), hi = std::min(end, e.offset + e.numel);
      if (lo < hi) sq -= g.narrow(0, lo - begin, hi - lo).to(at::kDouble).pow(2).sum();
    }
  }
  impl.comm->allreduce(sq, comm::ReduceOp::Sum, "ZeRO gradient norm");
  if (scope.across) scope.across->allreduce(sq, comm::ReduceOp::Sum, "gradient norm of all stages");
  // Note [Clipping on the device]
  return parallel::clip_to_norm(gradient_shards(), sq, max_norm);
}

std::vector<torch::Tensor> ShardedModel::gradient_shards() const {
  std::vector<torch::Tensor> out;
  for (const auto& s : impl_->units)
    out.push_back(s.grad_shard);
  return out;
}

void ShardedModel::step(const at::Tensor& found_inf) {
  DTORCH_CHECK(!impl_->readiness->in_backward(), "step() was called during backward");
  optim::step_unless(*impl_->optimizer, found_inf);
  publish_params();
}

void ShardedModel::publish_params() {
  impl_->publish();
}

void ShardedModel::Impl::publish() {
  torch::NoGradGuard no_grad;
  std::vector<size_t> started;
  for (size_t u = 0; u < units.size(); ++u) {
    auto& s = units[u];
    if (!s.materialized) continue;  // stage 3: gathered from the masters when next needed
    wait_for(s.gather, waited.gather);
    at::Tensor mine = own(s.full, u);
    if (!mine.is_same(s.master)) mine.copy_(s.master);
    s.gather = comm->allgather_into_async(
        s.full, mine, str("ZeRO-", opts.stage, " parameters of ", plan.units[u].name));
    started.push_back(u);
  }
  for (size_t u : started)
    wait_for(units[u].gather, waited.gather);
}

void ShardedModel::zero_grad() {
  torch::NoGradGuard no_grad;
  for (auto& s : impl_->units) {
    s.grad_shard.zero_();
    s.shard_zeroed = true;
    if (s.grad_full.defined()) s.grad_full.zero_();
  }
}

torch::optim::Optimizer& ShardedModel::optimizer() {
  return *impl_->optimizer;
}
const ShardPlan& ShardedModel::plan() const {
  return impl_->plan;
}
const Options& ShardedModel::options() const {
  return impl_->opts;
}
const std::vector<std::string>& ShardedModel::param_names() const {
  return impl_->names;
}
const std::vector<std::vector<int64_t>>& ShardedModel::param_shapes() const {
  return impl_->shapes;
}

WaitSeconds ShardedModel::wait_seconds() const {
  return impl_->waited;
}

MemoryStats ShardedModel::memory() const {
  MemoryStats m;
  for (auto& s : impl_->units) {
    if (!s.master.is_alias_of(s.full)) m.param_bytes += bytes_of(s.master);
    if (!s.grad_full.defined() || !s.grad_shard.is_alias_of(s.grad_full)) {
      m.grad_bytes += bytes_of(s.grad_shard);
    }
    m.grad_bytes += bytes_of(s.grad_full) + bytes_of(s.bucket) + bytes_of(s.incoming);
  }
  m.optim_bytes = parallel::state_bytes(*impl_->optimizer);
  for (size_t u = 0; u < impl_->units.size(); ++u) {
    if (impl_->always_gathered(u)) m.resident_unit_bytes += bytes_of(impl_->units[u].full);
  }
  m.param_bytes += impl_->gathered_bytes;
  m.peak_param_bytes = m.param_bytes - impl_->gathered_bytes + impl_->peak_gathered_bytes;
  return m;
}

void ShardedModel::init_optimizer_state() {
  auto& opt = *impl_->optimizer;
  for (auto& s : impl_->units) {
    const auto key = compat::optimizer_state_key(s.master);
    if (opt.state().count(key)) continue;
    if (auto st = parallel::fresh_state(opt, s.master)) opt.state()[key] = std::move(st);
  }
}

std::vector<ShardSlice> ShardedModel::checkpoint_slices() {
  auto& impl = *impl_;
  std::vector<ShardSlice> out;
  auto& state = impl.optimizer->state();
  for (size_t u = 0; u < impl.units.size(); ++u) {
    const Unit& unit = impl.plan.units[u];
    // Not a structured binding: clang before 16 lets no lambda capture one (the sanitizer and
    // fuzz builds use clang 14).
    const std::pair<int64_t, int64_t> owned = unit.owned(impl.rank());
    const int64_t begin = owned.first, length = owned.second - owned.first;
    auto slice = [&](const at::Tensor& t) { return t.narrow(0, 0, length); };
    out.push_back({"param/" + unit.name, unit.numel, begin, slice(impl.units[u].master)});
    auto it = state.find(compat::optimizer_state_key(impl.units[u].master));
    if (it == state.end()) continue;
    for (auto& [name, t] : parallel::state_tensors(*it->second))
      out.push_back({str("optim/", unit.name, "/", name), unit.numel, begin, slice(t)});
  }
  return out;
}

int64_t ShardedModel::optimizer_steps() const {
  auto& state = impl_->optimizer->state();
  auto it = state.find(compat::optimizer_state_key(impl_->units.at(0).master));
  return it == state.end() ? 0 : parallel::steps_of(*it->second);
}

void ShardedModel::set_optimizer_steps(int64_t steps) {
  for (auto& [key, st] : impl_->optimizer->state())
    parallel::set_steps(*st, steps);
}

std::shared_ptr<ShardedModel> shard(std::shared_ptr<torch::nn::Module> model,
                                    std::shared_ptr<comm::Communicator> comm, Options opts,
                                    const OptimizerFactory& make_optimizer) {
  return std::make_shared<ShardedModel>(std::move(model), std::move(comm), opts, make_optimizer);
}

}  // namespace dtorch::zero
