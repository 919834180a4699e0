// Sharded data parallelism (ZeRO stages 1-3; stage 3 is FSDP), applied to a model by a function:
//   auto sharded = dtorch::zero::shard(model, comm, opts /* stage 1-3 */, make_adamw);
//   loss.backward();            // gradients reduce-scattered into per-rank shards
//   sharded->clip_grad_norm(1.0);
//   sharded->step();            // each rank updates its shard; parameters gathered again
//   sharded->zero_grad();
// The optimizer is built by the caller's factory over the rank's flat fp32 master shards, so
// any elementwise torch::optim optimizer (SGD, Adam, AdamW) works unchanged.
// See Note [Flat units] in shard_plan.h and Note [Sharding stages] in sharded_model.cpp.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "dtorch/comm/communicator.h"
#include "dtorch/parallel/zero/offload.h"
#include "dtorch/parallel/zero/shard_plan.h"
#include "dtorch/parallel/zero/stage_names.h"

namespace dtorch::zero {

struct Options {
  /// 1: optimizer state sharded; 2: gradients too; 3: parameters too (FSDP).
  int stage = 2;
  /// Stages 1-2: parameters per unit (bucket), in MiB of fp32.
  double bucket_cap_mb = 25.0;
  /// Stage 3 wrap policy: consecutive blocks (Model::block_names()) are merged into one unit
  /// until it holds at least this many parameters; 0 gives one unit per block.
  int64_t min_unit_params = 0;
  /// Stage 3: start gathering the next unit while the current one computes.
  bool prefetch = true;
  /// Stage 3, a model that scopes its forward (models::Model::scopes_forward): release the
  /// root unit (the parameters outside blocks) when forward ends and gather it again when
  /// backward begins, as every other unit is; the ZeRO paper's 3x parameter bytes. Off, it
  /// stays gathered from forward to the end of its backward, as FSDP keeps its root: the
  /// models here use it at both ends of forward, so releasing it in between frees it only
  /// while the loss is computed (Note [Sharding stages]).
  bool reshard_root_after_forward = false;
  /// Stage 3 under accumulate_whole() (a pipeline's micro-batches; Note [ZeRO-3 under a
  /// pipeline]): off, every unit is gathered once when the guard is made and kept until
  /// reduce_accumulated() (one gather a step; the stages' parameters whole meanwhile). On, a
  /// unit is released after each micro-batch's forward and backward use and gathered again
  /// for the next (a unit whole only while its blocks run; two gathers per unit and
  /// micro-batch). Either way the gradients accumulate whole and are reduced once. Needs a
  /// schedule that runs each micro-batch's backward whole through one stage per rank (gpipe,
  /// 1f1b).
  bool reshard_after_microbatch = false;
  /// The dtype forward and backward see (and gathers move): kFloat, or kBFloat16 for mixed
  /// precision. The optimizer always updates fp32 master weights.
  torch::Dtype param_dtype = torch::kFloat;
  /// The dtype gradients are reduced in: kFloat, or kBFloat16 (half the bytes; on Gloo in
  /// LibTorch 1.13 the sum itself runs in fp32).
  torch::Dtype reduce_dtype = torch::kFloat;
  /// Broadcast buffers (BatchNorm statistics) from rank 0 after each backward, like DDP.
  bool broadcast_buffers = true;
  /// ZeRO-Offload: the fp32 master shards, their gradients and the optimizer's state live in
  /// the host's memory (pinned, for a model on a GPU) and the optimizer steps there (Note [State
  /// on the host] in sharded_model.cpp). The model computes where its parameters are. On a
  /// model on the CPU nothing moves, but the masters are kept apart from the parameters as on
  /// a GPU.
  bool state_on_host = false;
  /// With a folder: the optimizer's state lives in a file there between steps, read in piece
  /// by piece for the step (Note [Optimizer state on disk] in offload.h; ZeRO-Infinity's
  /// offload_optimizer to nvme). A model on a GPU needs state_on_host too. A name left empty is
  /// made unique to the process and rank.
  OffloadOptions optimizer_offload;
  /// Stage 3 with the optimizer's state on disk, a folder: the fp32 master shards live in a
  /// file there between their uses, mapped and paged by the kernel (Note [Parameters on disk]
  /// in param_offload.h; ZeRO-Infinity's offload_param to nvme). Only `dir` and `name` are
  /// read; a name left empty is made unique to the process and rank.
  OffloadOptions param_offload;
};

/// Bytes of model state this rank holds in the toolkit's own buffers.
struct MemoryStats {
  int64_t param_bytes = 0;  ///< gathered (full) parameters plus fp32 master shards when separate
  int64_t grad_bytes = 0;   ///< gradient buffers
  int64_t optim_bytes = 0;  ///< optimizer state in memory (momentum, Adam moments)
  /// Optimizer state on disk (Options::optimizer_offload), not counted in total().
  int64_t offloaded_optim_bytes = 0;
  /// Master shards on disk (Options::param_offload), not counted in param_bytes or total().
  int64_t offloaded_param_bytes = 0;
  /// Of total(): the bytes in the host's memory while the model computes on a GPU (the masters,
  /// their gradients and the optimizer's state under Options::state_on_host).
  int64_t host_bytes = 0;
  /// Stage 3: the most parameter bytes held at once, including units gathered for a block.
  int64_t peak_param_bytes = 0;
  /// Stage 3: bytes of the units that stay gathered between steps: the root unit of a model
  /// that does not scope its forward (models::Model::scopes_forward); 0 otherwise.
  int64_t resident_unit_bytes = 0;
  int64_t total() const { return param_bytes + grad_bytes + optim_bytes; }
};

/// Seconds a rank has waited for communication that computation did not hide: gathers of
/// parameters (ZeRO-3's units before their blocks run; ZeRO-1/2's updated parameters in
/// step()) and gradient reductions (ZeRO's reduce-scatters; DDP's allreduces, where a
/// train::Strategy reports them).
struct WaitSeconds {
  double gather = 0;
  double reduce = 0;
};

/// Builds the optimizer over the given (flat fp32 master) tensors.
using OptimizerFactory =
    std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)>;

/// One flat tensor's slice, as sharded checkpoints store it: rank `begin`..`begin+numel()`
/// of the logical flat tensor `key` whose full length is `full_numel`.
struct ShardSlice {
  std::string key;
  int64_t full_numel = 0;
  int64_t begin = 0;
  torch::Tensor data;  ///< 1-D, aliases the live buffer (writing it changes training state)
};

/// Where a gradient norm spans more than one sharded model: a pipeline stage's norm adds the
/// other stages' (summed over `across`, the ranks holding them), and leaves out the
/// parameters another stage counts (its copy of a tied embedding), by name.
struct NormScope {
  comm::Communicator* across = nullptr;
  std::set<std::string> counted_elsewhere;
};

class ShardedModel {
 public:
  /// RAII guard for gradient accumulation: while it lives, stage 1 accumulates gradients
  /// locally without communicating. Stages 2-3 never hold whole gradients, so they reduce
  /// every backward and accumulate the shards; the guard changes nothing for them (unless
  /// made by accumulate_whole()).
  class NoSync {
   public:
    NoSync(ShardedModel* m, bool whole);
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;
    NoSync(NoSync&& o) noexcept : m_(o.m_) { o.m_ = nullptr; }

   private:
    ShardedModel* m_;
  };

  /// RAII guard: every unit stays gathered (stage 3) so parameters can be read whole, e.g.
  /// to evaluate with a different number of batches per rank or to save model.pt.
  /// Collective: every rank must create and destroy it at the same point.
  class FullParams {
   public:
    explicit FullParams(ShardedModel* m);
    ~FullParams();
    FullParams(const FullParams&) = delete;
    FullParams& operator=(const FullParams&) = delete;

   private:
    ShardedModel* m_;
  };

  /// `replicas`, when given, holds the ranks with the same shards as this one (hybrid
  /// sharding; Note [Hybrid sharding] in sharded_model_reduce.cpp).
  ShardedModel(std::shared_ptr<torch::nn::Module> model, std::shared_ptr<comm::Communicator> comm,
               Options opts, const OptimizerFactory& make_optimizer,
               std::shared_ptr<comm::Communicator> replicas = nullptr);
  ~ShardedModel();
  ShardedModel(const ShardedModel&) = delete;
  ShardedModel& operator=(const ShardedModel&) = delete;

  [[nodiscard]] NoSync no_sync();
  /// While the guard lives, gradients accumulate whole in the parameters' .grad without
  /// communicating, so several backward passes (a pipeline's micro-batches) cost one
  /// reduction, by reduce_accumulated() after the guard. Stage 2 then holds whole gradients
  /// until that reduction (as FSDP's no_sync does) and only shards after it; stage 3 also
  /// gathers every unit now and keeps them until then, or releases each between uses
  /// (Options::reshard_after_microbatch; Note [ZeRO-3 under a pipeline]). Collective for
  /// stage 3.
  [[nodiscard]] NoSync accumulate_whole();
  [[nodiscard]] FullParams full_params();
  /// Calls visit(i, whole) for every parameter i in param_names()' order with its whole value.
  /// Stage 3 gathers a parameter's unit for it and releases the unit once the next parameter
  /// lies in another, so at most one unit is whole beyond what training holds (Note [Model
  /// files written as they are gathered] in checkpoint/state_dict.h). Collective.
  void each_whole_parameter(const std::function<void(size_t, const at::Tensor&)>& visit);
  /// After backward passes under no_sync() (stage 1) or accumulate_whole(): reduce-scatters
  /// the accumulated gradients now, as a synchronised backward would have (stage 3 releasing
  /// each unit as its reduction starts). Collective.
  void reduce_accumulated();

  /// Scales the gradient shards so that the norm of the whole (unsharded) gradient is at
  /// most max_norm, as torch::nn::utils::clip_grad_norm_ would on the full gradient; returns
  /// that norm before clipping, a 0-dim float64 tensor on the gradients' device that nothing
  /// reads on the host (Note [Clipping on the device] in parallel/grad_clip.h). Collective
  /// (and over scope.across).
  at::Tensor clip_grad_norm(double max_norm, const NormScope& scope = {});
  /// This rank's fp32 gradient shards, one per unit (what step() applies; scaling them
  /// scales the step).
  std::vector<torch::Tensor> gradient_shards() const;
  /// Updates this rank's shards with the optimizer, then makes the parameters whole again
  /// (stages 1-2) or leaves them sharded until the next forward (stage 3); a nonzero
  /// `found_inf` (fp16's overflow flag on the device) leaves the shards as they are (Note
  /// [Steps the device skips] in optim/fused.h). Collective.
  void step(const at::Tensor& found_inf = {});
  /// Clears the gradient shards (call after step, before the next backward).
  void zero_grad();

  torch::optim::Optimizer& optimizer();
  /// Where the optimizer's state lives between steps (Options::optimizer_offload), or null when
  /// it stays in memory.
  const OptimizerOffload* optimizer_offload() const;
  const ShardPlan& plan() const;
  const Options& options() const;
  MemoryStats memory() const;
  /// Communication waits since the model was sharded.
  WaitSeconds wait_seconds() const;
  /// Names of the model's parameters, in the order the plan's indices use.
  const std::vector<std::string>& param_names() const;
  /// Shapes of the model's parameters, in the same order.
  const std::vector<std::vector<int64_t>>& param_shapes() const;

  /// This rank's slices of every flat tensor a sharded checkpoint holds: "param/<unit>" (fp32
  /// master weights) and "optim/<unit>/<state>" (the optimizer's per-element state), plus
  /// "optim/step" (a 1-element tensor, the same on every rank). Optimizer state exists only
  /// after the first step.
  std::vector<ShardSlice> checkpoint_slices();
  /// For a save that outlives this step, after checkpoint_slices(): what gives, for a slice of
  /// the optimizer's state or of a master shard kept on disk, a copy of it on disk that later
  /// steps do not reach (OptimizerOffload::snapshot, ParamOffload::snapshot); undefined for any
  /// other tensor, or null without offload.
  std::function<at::Tensor(const at::Tensor&)> snapshot_state_on_disk();
  /// Makes the optimizer's state exist (as after one step with zero gradients), so that
  /// checkpoint_slices() lists every tensor a loaded checkpoint will fill.
  void init_optimizer_state();
  /// Copies the master shards into the parameters the model computes with (after loading
  /// new values into "param/..." slices). Collective.
  void publish_params();
  /// Adam(W)'s step count (the same for every shard); 0 for SGD or before the first step.
  int64_t optimizer_steps() const;
  /// Sets it on every shard's state (after init_optimizer_state, when loading).
  void set_optimizer_steps(int64_t steps);

  struct Impl;  ///< opaque; public only for the autograd hooks of sharded_model_gather.cpp

 private:
  friend class NoSync;
  friend class FullParams;
  std::unique_ptr<Impl> impl_;
};

/// Shards `model` over `comm` (see Note [Sharding stages]): checks that every rank built the
/// same model, makes all ranks start from rank 0's weights, packs the parameters into flat
/// units, and installs gradient hooks (and, for stage 3 on a models::Model with blocks, the
/// block hooks that gather units on demand). The model's parameters become views into the
/// units: keep the returned handle alive as long as the model trains. With `replicas` (FSDP's
/// HSDP, ZeRO++'s hpZ; Note [Hybrid sharding] in sharded_model_reduce.cpp), `comm` is one
/// replica's ranks and `replicas` the ranks holding the same shards in the others: each
/// shard's gradient is averaged across them too, and all start from replica 0's rank 0.
std::shared_ptr<ShardedModel> shard(std::shared_ptr<torch::nn::Module> model,
                                    std::shared_ptr<comm::Communicator> comm, Options opts,
                                    const OptimizerFactory& make_optimizer,
                                    std::shared_ptr<comm::Communicator> replicas = nullptr);

/// Of this rank's checkpoint slices, the part it writes when `count` replicas hold the same
/// ones (Note [Hybrid sharding]): replica `index`'s run of each slice, so that every element is
/// written once and every rank writes about as much.
std::vector<ShardSlice> replica_part(const std::vector<ShardSlice>& slices, int index, int count);

}  // namespace dtorch::zero
