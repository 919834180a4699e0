// ShardedModel: executes a ShardPlan (ZeRO stages 1-3) for one model: flat units, gradient
// reduce-scatter during backward, sharded optimizer step, and gathers (see zero.h).
// Packing the model into units is sharded_model_build.cpp's, stage 3's gathers
// sharded_model_gather.cpp's, the gradient reduction sharded_model_reduce.cpp's.
#include <algorithm>
#include <optional>

#include "dtorch/core/device.h"
#include "dtorch/core/error.h"
#include "dtorch/core/torch_compat.h"
#include "dtorch/optim/fused.h"
#include "dtorch/parallel/grad_clip.h"
#include "dtorch/parallel/optimizer_state.h"
#include "dtorch/parallel/zero/sharded_model_impl.h"
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
// A model built without memory (Note [Deferred initialisation]) has no weights to pack: its
// units' full buffers are allocated and released untouched, and each rank fills its masters
// from the model's units built again one at a time (init_deferred).

// Note [State on the host]
// ZeRO-Offload (DeepSpeed's offload_optimizer to the cpu, FSDP's CPUOffload): with
// Options::state_on_host a model on a GPU keeps only what forward and backward use there (the
// parameters in the compute dtype: whole at stages 1-2, gathered units at stage 3; the
// gradient buckets); the fp32 masters, their gradient shards and the optimizer's state live in
// pinned host memory, and the optimizer steps on the host (the fused CPU kernels, Note [Fused
// optimizers]). Device memory falls by what those take, with AdamW 12 bytes a parameter over
// the rank count (ZeRO-2 in fp32, whose master is its parameters' chunk) to 16 (ZeRO-3, mixed
// precision); stage 1 keeps its whole gradient there. The step pays the copies and the host's
// step:
// - Gradients stream to the host bucket by bucket: as each reduce-scatter finishes during
//   backward (Note [Buckets in flight]) its chunk is copied asynchronously into the gradient
//   shard (or, when the shard holds gradients already, beside it, and added); the copies are
//   queued behind backward's kernels on the device's stream and the host does not wait for
//   them. Backward's end waits for the device once (land) and adds what landed beside.
// - The step waits for the device (the host's step must not change a master while a copy
//   reads it) and reads the overflow flag there. Clipping sums the shards' squares on the host
//   and reduces them on the device.
// - The host steps one unit at a time (step_by_unit; OptimizerOffload's pieces with the state
//   on disk), and each unit's update goes back as soon as it has stepped, while the host steps
//   the next: stages 1-2 copy the unit's shard into the parameters asynchronously and
//   all-gather it; stage 3 copies a master into its unit when the unit is next gathered.
// The masters stay apart from the parameters at every stage and dtype (ZeRO-1/2 in fp32 update
// the parameters' own chunk in place otherwise), so a model on the CPU runs the same path with
// nothing moving (the tests' way to check it). With the optimizer's state on disk (Note
// [Optimizer state on disk]) and ZeRO-3's masters there too (Note [Parameters on disk]), the
// host memory they would take is a file's: the same flags on a GPU, ZeRO-Infinity.

// Note [Spare unit memory] is in sharded_model_impl.h, Note [Gradient buckets of stage 2] in
// sharded_model_reduce.cpp.

// ---- ShardedModel ------------------------------------------------------------------------

ShardedModel::ShardedModel(std::shared_ptr<torch::nn::Module> model,
                           std::shared_ptr<comm::Communicator> comm, Options opts,
                           const OptimizerFactory& make_optimizer,
                           std::shared_ptr<comm::Communicator> replicas)
    : impl_(std::make_unique<Impl>()) {
  impl_->module = std::move(model);
  impl_->comm = std::move(comm);
  if (replicas && replicas->size() > 1) impl_->replicas = std::move(replicas);
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

void ShardedModel::each_whole_parameter(
    const std::function<void(size_t, const at::Tensor&)>& visit) {
  auto& impl = *impl_;
  std::optional<size_t> held;
  for (size_t i = 0; i < impl.params.size(); ++i) {
    const size_t u = impl.plan.where[i].first;
    if (held != u) {
      if (held) impl.release(*held);
      impl.ensure_gathered(u);
      held = u;
    }
    visit(i, impl.params[i].detach());
  }
  if (held) impl.release(*held);
}

at::Tensor ShardedModel::clip_grad_norm(double max_norm, const NormScope& scope) {
  DTORCH_CHECK_T(ConfigError, max_norm > 0, "clip-grad-norm must be positive (got ", max_norm, ")");
  auto& impl = *impl_;
  // Note [State on the host]: summed where the shards are, reduced where the collectives are.
  at::Tensor sq = parallel::sum_of_squares(gradient_shards(), impl.on_state(at::kDouble).device());
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
  sq = sq.to(impl.device);
  impl.comm->allreduce(sq, comm::ReduceOp::Sum, "ZeRO gradient norm");
  if (scope.across) scope.across->allreduce(sq, comm::ReduceOp::Sum, "gradient norm of all stages");
  // Note [Clipping on the device]
  return parallel::clip_to_norm(gradient_shards(), sq.to(impl.on_state(at::kDouble).device()),
                                max_norm);
}

std::vector<torch::Tensor> ShardedModel::gradient_shards() const {
  std::vector<torch::Tensor> out;
  for (const auto& s : impl_->units)
    out.push_back(s.grad_shard);
  return out;
}

void ShardedModel::step(const at::Tensor& found_inf) {
  Impl& impl = *impl_;
  DTORCH_CHECK(!impl.readiness->in_backward(), "step() was called during backward");
  at::Tensor skip = found_inf;
  if (impl.opts.state_on_host) {  // Note [State on the host]
    synchronize(impl.device);
    if (skip.defined()) skip = skip.to(at::kCPU);
  }
  // A unit stepped alone goes back to the parameters while the next one steps.
  std::vector<bool> sent(impl.units.size(), false);
  auto stepped = [&](size_t u) {
    impl.publish_unit(u);
    sent[u] = true;
  };
  if (impl.offload) {
    // Note [Parameters on disk]: a checkpoint or an evaluation may have paged masters in.
    if (impl.params_on_disk) impl.params_on_disk->evict_all();
    impl.offload->step(skip, stepped);  // Note [Optimizer state on disk]
  } else if (impl.opts.state_on_host) {
    impl.step_by_unit(skip, stepped);
  } else {
    optim::step_unless(*impl.optimizer, skip);
  }
  for (size_t u = 0; u < impl.units.size(); ++u)
    if (!sent[u]) impl.publish_unit(u);
  for (auto& s : impl.units)
    impl.wait_for(s.gather, impl.waited.gather);
}

// Note [State on the host]: the optimizer steps one unit's master at a time (Note [Steps a
// part at a time]), so that each unit's update is copied back and gathered while the host
// steps the next.
void ShardedModel::Impl::step_by_unit(const at::Tensor& skip,
                                      const std::function<void(size_t)>& stepped) {
  std::vector<at::Tensor> masters;
  for (auto& s : units)
    masters.push_back(s.master);
  const optim::HiddenGradients hidden(masters);
  if (optim::skipped_over_nothing(*optimizer, skip)) return;
  for (size_t u = 0; u < units.size(); ++u) {
    units[u].master.mutable_grad() = hidden.grads()[u];
    optimizer->step();
    units[u].master.mutable_grad() = at::Tensor();
    stepped(u);
  }
}

void ShardedModel::publish_params() {
  impl_->publish();
}

void ShardedModel::Impl::publish() {
  for (size_t u = 0; u < units.size(); ++u)
    publish_unit(u);
  for (auto& s : units)
    wait_for(s.gather, waited.gather);
}

// Starts copying unit u's master into the parameters and gathering them; a stage 3 unit not
// gathered now gathers from its master when next needed.
void ShardedModel::Impl::publish_unit(size_t u) {
  torch::NoGradGuard no_grad;
  auto& s = units[u];
  if (s.materialized) {
    wait_for(s.gather, waited.gather);
    at::Tensor mine = own(s.full, u);
    // Note [State on the host]
    if (!mine.is_same(s.master)) mine.copy_(s.master, async_copies());
    s.gather = comm->allgather_into_async(
        s.full, mine, str("ZeRO-", opts.stage, " parameters of ", plan.units[u].name));
  }
  evict_master(u);  // Note [Parameters on disk]
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
const OptimizerOffload* ShardedModel::optimizer_offload() const {
  return impl_->offload.get();
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
  int64_t on_host = 0;  // Note [State on the host]
  for (auto& s : impl_->units) {
    if (impl_->params_on_disk) {
      m.offloaded_param_bytes += bytes_of(s.master);  // Note [Parameters on disk]
    } else if (!s.master.is_alias_of(s.full)) {
      m.param_bytes += bytes_of(s.master);
      on_host += bytes_of(s.master);
    }
    if (!s.grad_full.defined() || !s.grad_shard.is_alias_of(s.grad_full)) {
      m.grad_bytes += bytes_of(s.grad_shard);
      on_host += bytes_of(s.grad_shard);
    }
    m.grad_bytes +=
        bytes_of(s.grad_full) + bytes_of(s.bucket) + bytes_of(s.incoming) + bytes_of(s.landed);
    on_host += bytes_of(s.landed);
  }
  m.optim_bytes = parallel::state_bytes(*impl_->optimizer);
  if (impl_->offload) {
    m.offloaded_optim_bytes = impl_->offload->swapped_bytes();
    m.optim_bytes -= m.offloaded_optim_bytes;
  }
  if (impl_->async_copies()) m.host_bytes = on_host + m.optim_bytes;
  for (size_t u = 0; u < impl_->units.size(); ++u) {
    if (impl_->always_gathered(u)) m.resident_unit_bytes += bytes_of(impl_->units[u].full);
  }
  m.param_bytes += impl_->gathered_bytes;
  m.peak_param_bytes = m.param_bytes - impl_->gathered_bytes + impl_->peak_gathered_bytes;
  return m;
}

void ShardedModel::init_optimizer_state() {
  auto& opt = *impl_->optimizer;
  if (impl_->offload) impl_->offload->init_state();  // Note [Optimizer state on disk]
  for (auto& s : impl_->units) {
    const auto key = compat::optimizer_state_key(s.master);
    if (opt.state().count(key)) continue;
    if (auto st = parallel::fresh_state(opt, s.master)) opt.state()[key] = std::move(st);
  }
}

std::function<at::Tensor(const at::Tensor&)> ShardedModel::snapshot_state_on_disk() {
  auto state = impl_->offload ? impl_->offload->snapshot() : nullptr;
  if (!impl_->params_on_disk) return state;
  // Note [Parameters on disk]: the master shards' slices from a copy of their file too.
  auto shards = impl_->params_on_disk->snapshot();
  return [state, shards](const at::Tensor& t) {
    at::Tensor copy = shards(t);
    return copy.defined() || !state ? copy : state(t);
  };
}

std::vector<ShardSlice> ShardedModel::checkpoint_slices() {
  auto& impl = *impl_;
  std::vector<ShardSlice> out;
  if (impl.offload) impl.offload->page_in_all();  // the slices alias the state, mapped
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
                                    const OptimizerFactory& make_optimizer,
                                    std::shared_ptr<comm::Communicator> replicas) {
  return std::make_shared<ShardedModel>(std::move(model), std::move(comm), opts, make_optimizer,
                                        std::move(replicas));
}

std::vector<ShardSlice> replica_part(const std::vector<ShardSlice>& slices, int index, int count) {
  std::vector<ShardSlice> out;
  for (const ShardSlice& s : slices) {
    const int64_t n = s.data.numel();
    const int64_t begin = n * index / count, end = n * (index + 1) / count;
    if (end > begin)
      out.push_back({s.key, s.full_numel, s.begin + begin, s.data.narrow(0, begin, end - begin)});
  }
  return out;
}

}  // namespace dtorch::zero
