// ShardedModel's stage 3 gathers (Note [Sharding stages] in sharded_model.cpp): the block and
// forward hooks that gather a unit before it runs and release it after, the autograd function
// that gathers it again for backward, and the gather and release themselves.
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <chrono>

#include "dtorch/core/storage.h"
#include "dtorch/parallel/zero/sharded_model_impl.h"

namespace dtorch::zero {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

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
  mine.copy_(s.master, async_copies());  // Note [State on the host]
  evict_master(u);                       // Note [Parameters on disk]
  if (params_on_disk && u + 1 < units.size()) params_on_disk->read_ahead(u + 1);
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

}  // namespace dtorch::zero
