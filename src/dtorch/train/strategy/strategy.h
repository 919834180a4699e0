// How the trainer spreads a model over ranks: DDP, or a ZeRO stage (1-3, stage 3 being FSDP),
// each with its optimizer, mixed precision, gradient clipping and checkpoints behind one small
// interface, so the training loop reads the same whatever `--strategy` says. strategy/ is a room
// of train/ (Note [train's rooms] in train/config/run_config.h): it includes config/, not the loop.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtorch/checkpoint/checkpoint.h"
#include "dtorch/comm/communicator.h"
#include "dtorch/core/device.h"
#include "dtorch/core/enum_names.h"
#include "dtorch/core/trace_range.h"
#include "dtorch/models/model.h"
#include "dtorch/parallel/autocast.h"
#include "dtorch/parallel/cp/context_parallel.h"
#include "dtorch/parallel/ddp/ddp.h"
#include "dtorch/parallel/parallel_dims.h"
#include "dtorch/parallel/pp/pipeline.h"
#include "dtorch/parallel/pp/stage_plan.h"
#include "dtorch/parallel/tp/tensor_parallel.h"
#include "dtorch/parallel/zero/zero.h"
#include "dtorch/train/config/strategy_config.h"
#include "dtorch/train/strategy/loss_scaler.h"

namespace dtorch::train {
inline namespace strategy {

/// The device this process trains on: `spec` (--device) for the job's rank
/// `job` (its LOCAL_RANK and LOCAL_WORLD_SIZE; Note [One GPU per rank]), made the current CUDA
/// device. Ranks may share a GPU when the job's backend is Gloo (DTORCH_BACKEND=gloo).
/// ConfigError as resolve_device says.
at::Device resolve_run_device(DeviceKind spec, const launch::RankInfo& job);

/// The writing of a checkpoint whose state is already copied (Strategy::stage): collective
/// over the communicator it is given, the strategy's save_group() or, for a save in the
/// background, a twin of it (Note [Checkpoints in the background] in train/background_save.h).
using SaveJob = std::function<void(comm::Communicator&)>;

class Strategy {
 public:
  virtual ~Strategy() = default;
  /// Backward of `loss`; sync=false accumulates gradients without communicating where the
  /// strategy can (DDP and ZeRO-1; ZeRO-2/3 reduce every backward).
  virtual void backward(const torch::Tensor& loss, bool sync) = 0;
  /// Runs `work`, which may run backward many times (a pipeline schedule does), with the
  /// gradients accumulating whole and locally, then reduces them across the data-parallel
  /// group once. DDP, ZeRO-1 and ZeRO-2 (ZeRO-3: ConfigError). Collective.
  virtual void backward_accumulated(const std::function<void()>& work) = 0;
  /// Clips the whole gradient to `max_norm` (when > 0; under a pipeline, the norm of every
  /// stage's gradient together), updates the weights and clears the gradients. Returns the
  /// gradient norm before clipping as a 0-dim tensor on the device, which nothing reads on the
  /// host (Note [Clipping on the device] in parallel/grad_clip.h); undefined when not clipping
  /// or when fp16 skipped the step. Collective.
  virtual torch::Tensor step(double max_norm) = 0;
  /// Keeps every parameter whole until the returned guard is destroyed (ZeRO-3 gathers);
  /// needed to evaluate with a different number of batches per rank, or to save the model.
  /// Collective.
  virtual std::shared_ptr<void> whole_parameters() = 0;
  /// Hands `take` every parameter of the model whole, under its state-dict name and in its
  /// order, holding no more of the model whole than one ZeRO-3 unit (Note [Model files written
  /// as they are gathered] in checkpoint/state_dict.h). Collective.
  virtual void each_whole_parameter(const checkpoint::TakeTensor& take) = 0;
  /// The job that writes a checkpoint of model and optimizer into `dir`. With `background`,
  /// what it writes is copied into host memory first, so that the model and optimizer may
  /// change as soon as stage returns; without, the job reads them and must run at once.
  /// Collective (tensor-parallel ranks gather the unsplit model).
  virtual SaveJob stage(const std::string& dir, const checkpoint::CheckpointData& data, int keep,
                        bool background) = 0;
  /// The group the jobs of stage() are collective over.
  virtual comm::Communicator& save_group() = 0;
  /// Writes a checkpoint of model and optimizer into `dir` now. Collective.
  void save(const std::string& dir, const checkpoint::CheckpointData& data, int keep) {
    TraceRange range("checkpoint");
    stage(dir, data, keep, /*background=*/false)(save_group());
  }
  /// Restores the newest good checkpoint in `dir` (any world size for the sharded
  /// strategies); nullopt when there is none. Collective.
  virtual std::optional<checkpoint::LoadedCheckpoint> load_latest(const std::string& dir) = 0;
  /// Sets the learning rate of the optimizer's next step (a schedule's value).
  virtual void set_lr(double lr) = 0;
  /// Model state this rank holds, in bytes.
  virtual zero::MemoryStats memory() const = 0;
  /// Communication waits since the strategy was made (for `dtorch bench memory`'s phases).
  virtual zero::WaitSeconds comm_waits() const = 0;
  /// What forward runs under: autocast to bf16 or fp16 on the model's device, or nothing.
  virtual parallel::AutocastMode autocast() const = 0;
  /// The factor backward scales the loss by (fp16's dynamic loss scale; 1 otherwise), and how
  /// many optimizer steps were skipped because a gradient overflowed at that scale.
  virtual double loss_scale() const = 0;
  virtual int64_t skipped_steps() const = 0;
  /// Where the model's parameters (and the strategy's buffers) are.
  virtual at::Device device() const = 0;
  /// One line for the log: "zero3 (5 units), bf16 compute, fp32 reduction".
  virtual std::string describe() const = 0;
};

/// Tensor parallelism under a strategy (the trainer's --tp): the handle tp::parallelize()
/// returned, and how to build the unsplit model, which checkpoints are written in (Note
/// [Tensor-parallel checkpoints] in ddp_strategy.cpp). Empty: no tensor parallelism.
struct TensorParallelism {
  std::shared_ptr<tp::TensorParallel> handle;
  std::function<std::shared_ptr<models::Model>()> make_full_model;
};

/// Pipeline parallelism under a strategy (the trainer's --pp): the pipeline over this rank's
/// pp group, which stages it runs and how the model was cut (checkpoints: Note [Pipeline
/// checkpoints]). Empty: no pipeline.
struct PipelineParallelism {
  std::shared_ptr<pp::Pipeline> pipeline;
  pp::StagePlan plan;
  /// The stages this rank runs, in order: its pp rank, and under an interleaved schedule
  /// also pp rank + k x pp; pipeline->stages() holds their models.
  std::vector<int> stages;
  /// The first of them, the rank's own pp index.
  int stage() const { return stages.front(); }
};

/// Hybrid sharding under a sharded strategy (the trainer's --dp-replicate; Note [Hybrid
/// sharding] in parallel/zero/sharded_model_reduce.cpp): the ranks of this rank's replica that
/// its shards spread over, and the ranks holding the same shards in the other replicas. Empty:
/// the shards spread over the whole data-parallel group.
struct HybridSharding {
  std::shared_ptr<comm::Communicator> shard, replicate;
};

/// The groups a run trains over: the data-parallel communicator its strategy runs on, and the
/// tensor, context or pipeline parallelism under it.
struct Layout {
  /// The ranks holding the same parameters, which the strategy reduces gradients over: the dp
  /// group, or under context parallelism dp x cp (Note [Mesh layout]).
  std::shared_ptr<comm::Communicator> dp;
  TensorParallelism tp;                     ///< empty for tp 1
  PipelineParallelism pp;                   ///< empty for pp 1
  std::shared_ptr<cp::ContextParallel> cp;  ///< null for cp 1
  HybridSharding hybrid;                    ///< empty for --dp-replicate 1
  parallel::MeshPlan plan;

  /// Which share of the data this rank reads, and of how many: the dp group's (the cp ranks of
  /// a replica read the same batches and each keep their tokens).
  int data_rank() const { return dp->rank() / plan.cp; }
  int data_ranks() const { return dp->size() / plan.cp; }
  /// This rank's part of a batch's token ids or targets (all of it without cp).
  torch::Tensor local_tokens(const torch::Tensor& x) const;
};

/// Applies the configured strategy to `model` (which must be freshly built from the same
/// seed on every rank; rank 0's weights win) over `comm`, the data-parallel group; with
/// `tp`, `model` is already split across the tensor-parallel group. With `hybrid` (a sharded
/// strategy only), `comm` still holds every data-parallel rank: checkpoints are written over it.
std::unique_ptr<Strategy> make_strategy(const StrategyConfig& c,
                                        std::shared_ptr<models::Model> model,
                                        std::shared_ptr<comm::Communicator> comm,
                                        TensorParallelism tp = {}, PipelineParallelism pp = {},
                                        HybridSharding hybrid = {});

}  // namespace strategy
}  // namespace dtorch::train
