// ShardedModel's gradient reduction (Note [Sharding stages] in sharded_model.cpp): each unit's
// gradients moved into a bucket as backward produces them, reduce-scattered into this rank's
// shard while backward goes on, and the reductions finished in launch order.
#include "dtorch/core/device.h"
#include "dtorch/core/storage.h"
#include "dtorch/parallel/model_sync.h"
#include "dtorch/parallel/zero/sharded_model_impl.h"

namespace dtorch::zero {

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
  s.land_in_shard = s.shard_zeroed;  // Note [State on the host]
  s.shard_zeroed = false;
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
  const bool direct = s.land_in_shard && opts.reduce_dtype == at::kFloat && !opts.state_on_host;
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
  const bool reduced = s.reduce.valid();  // not yet finished (wait_reductions finishes all)
  wait_for(s.reduce, waited.reduce);
  if (replicas && reduced) {  // Note [Hybrid sharding]
    average_across_replicas(s.incoming.defined() ? s.incoming : s.grad_shard,
                            str("ZeRO-", opts.stage, " gradient shard across replicas"));
  }
  if (s.incoming.defined() && !opts.state_on_host) {
    s.grad_shard.add_(s.incoming);
  } else if (s.incoming.defined() && s.land_in_shard) {
    s.grad_shard.copy_(s.incoming, async_copies());  // Note [State on the host]
  } else if (s.incoming.defined()) {
    s.landed = at::empty(s.incoming.sizes(), on_state(s.incoming.scalar_type()));
    s.landed.copy_(s.incoming, async_copies());
  }
  s.incoming = at::Tensor();
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
  land();
}

// Note [State on the host]: the chunks copied to the host as backward went on are there once
// the device has run the copies; a shard that held gradients already adds its chunk.
void ShardedModel::Impl::land() {
  if (!opts.state_on_host) return;
  synchronize(device);
  torch::NoGradGuard no_grad;
  for (auto& s : units) {
    if (s.landed.defined()) s.grad_shard.add_(s.landed);
    s.landed = at::Tensor();
  }
}

// Note [Hybrid sharding]
// FSDP2's HSDP (torchtitan's dp_replicate x dp_shard), DeepSpeed ZeRO++'s hpZ: on a cluster the
// links inside a node are an order of magnitude faster than those between nodes, so the shards
// are spread over one replica's ranks (a node's, MeshPlan's dp_shard group: `comm`) and the
// replicas hold the same shards (`replicas`: the ranks at this rank's place in every replica).
// --dp-replicate auto makes each node a replica, or under --pp each node of a stage's (the
// stages vary slowest, so a stage on one node needs no replicas; resolve_replicas).
// - Gradients: each unit is reduce-scattered inside the replica as without replicas; when its
//   reduction finishes, this rank's reduced chunk (1/S of the unit, for S ranks a replica) is
//   averaged across the R replicas (an allreduce of the chunk, before it is added to the shard
//   or copied to the host), so every replica steps the same shards with the gradient of the
//   whole batch. Averages of averages over equal groups are the average over all R x S ranks.
// - Everything else stays inside the replica: stage 3's gathers, ZeRO-1/2's gathers of the
//   updated parameters, the gradient norm (the replicas' shards are equal), the optimizer.
//   fp16's overflow flag needs nothing more: an inf or a NaN in any replica reaches every
//   replica's average.
// - Every rank starts from rank 0's weights, buffers and (deferred initialisation) generator
//   state: broadcast across the replicas first (replica 0's ranks to their places), then inside
//   each replica; buffers are broadcast so after every backward.
// Bytes across nodes per step, summed over the job, for P parameters of b bytes (padded to the
// units' shards) on R nodes of S ranks (N = R x S), as Traffic counts them (Note [Traffic
// across nodes] in comm/communicator_collectives.cpp): a ring over all N ranks crosses nodes at
// R of its hops, so plain ZeRO's R ranks that end a node send everything they send across, R x
// T for T a rank's bytes a step ((N-1)/N x P x b for the reduce-scatter and for each gather of
// the model); under hybrid sharding only the chunks' allreduce crosses, 2 (R-1)/R x P x b / S
// from every rank, 2 x P x b in all, over S disjoint rings of one rank a node. The shard
// groups' T is (S-1)/S over (N-1)/N of plain ZeRO's, which gives plain ZeRO's total from a
// hybrid run (bench memory prints both). gpt-debug under zero3 on 2 nodes of 2 (fp32,
// P x b = 138752 bytes): plain ZeRO sends 568704 bytes a step across (284352 from each of
// ranks 1 and 3), hybrid sharding 277504 (69376 from each rank); the intra-node gathers halve
// too, 180288 bytes a rank to 120192. gpt-small (P x b = 497903616 bytes, `dtorch bench memory
// --model gpt-small --strategy zero3 --dp-replicate 1|2` under two launchers of 2 ranks): plain
// 2004037632 bytes a step across (1002018816 from each of ranks 1 and 3), hybrid 995807232
// (248951808 from each rank), half; the run prints both totals.
// Checkpoints are written over all R x S ranks, each writing its replica's part of its shards
// (replica_part), and so read back at any layout as plain ZeRO's are (Note [Resharding by
// name]).

void ShardedModel::Impl::broadcast_from_first(at::Tensor& t, const std::string& what) {
  if (replicas) replicas->broadcast(t, 0, what + " across replicas");
  comm->broadcast(t, 0, what);
}

void ShardedModel::Impl::broadcast_from_first(const std::vector<at::Tensor>& ts,
                                              const std::string& what) {
  if (replicas) parallel::broadcast_from_rank0(ts, *replicas, what + " across replicas");
  parallel::broadcast_from_rank0(ts, *comm, what);
}

void ShardedModel::Impl::average_across_replicas(at::Tensor& chunk, const std::string& what) {
  comm::Work w = replicas->allreduce_async(chunk, comm::ReduceOp::Avg, what);
  wait_for(w, waited.reduce);
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
    broadcast_from_first(buffers, str("ZeRO-", opts.stage, " buffers"));
  }
}

}  // namespace dtorch::zero
