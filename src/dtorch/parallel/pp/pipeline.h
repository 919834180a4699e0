// Pipeline parallelism applied to a model: each rank holds a few of its stages (Note [Pipeline
// units]), runs a schedule's action list (Note [Schedules as data]) and moves activations and
// their gradients by isend/irecv (Note [Pipeline execution]).
//   auto stage = models::make_model("gpt-debug", plan.stages[pp_rank]);
//   pp::Pipeline pipe({stage}, pp_group, {pp::ScheduleKind::OneFOneB, 8});
//   auto r = pipe.step(tokens, targets, loss);   // gradients accumulate in stage's .grad
#pragma once

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "dtorch/comm/communicator.h"
#include "dtorch/models/model.h"
#include "dtorch/parallel/pp/schedule.h"

namespace dtorch::pp {

struct PipelineOptions {
  ScheduleKind schedule = ScheduleKind::OneFOneB;
  int microbatches = 4;
  int virtual_stages = 0;  ///< stages per rank; 0: the schedule's default
};

/// The last stage's loss of one micro-batch: mean over its samples (or tokens).
using PipelineLoss = std::function<at::Tensor(const at::Tensor& output, const at::Tensor& target)>;
/// Sees each micro-batch's output (detached) and targets on the last stage: metrics.
using OutputObserver = std::function<void(const at::Tensor& output, const at::Tensor& target)>;

struct PipelineStepResult {
  /// The batch's mean loss; set only on the rank holding the last stage.
  double loss = 0;
  bool has_loss = false;
  /// The most (stage, micro-batch) activations this rank held at once.
  int peak_activations = 0;
  /// Wall time of the step on this rank, and the part spent computing (forward and backward
  /// actions): 1 - compute / seconds is the measured bubble.
  double seconds = 0, compute_seconds = 0;
};

/// Note [Pipeline execution]: a rank runs its list of actions in order. Forward takes the
/// micro-batch (first stage) or the received activation, made a leaf that requires grad;
/// the last stage applies the loss, weighted by micro-batch size over batch size so the
/// accumulated gradient is the whole batch's mean gradient. Sends are isend, waited at the
/// end of the step, so they overlap the next micro-batch's compute; receives are posted at
/// the action. Message tags name (stage, kind, micro-batch). Shapes are agreed once: the first
/// activation of each micro-batch shape crossing a stage boundary is preceded by a small
/// header (dims, dtype); later ones are received into buffers of the known shape. Parameters
/// held by several stages (a GPT's tied embedding) have their gradients summed over the
/// ranks holding them at the end of the step. BatchNorm sees one micro-batch at a time and
/// updates its running statistics once per micro-batch, as PyTorch's pipelining does: the
/// reference to compare with is one process accumulating gradients over the same
/// micro-batches.
class Pipeline {
 public:
  /// `stages`: this rank's stages in order, stage pp->rank() + k * pp->size() for k = 0 ..
  /// virtual stages - 1. Collective over `pp` (agrees on tied parameters).
  Pipeline(std::vector<std::shared_ptr<models::Model>> stages,
           std::shared_ptr<comm::Communicator> pp, PipelineOptions opts);
  ~Pipeline();

  /// Forward and backward of `inputs` (the whole batch, split along dim 0 into micro-batches)
  /// against `targets`; gradients accumulate into the stages' parameters. Every rank of the
  /// pipeline passes the same batch (shapes, at least; only the first stage reads inputs and
  /// only the last reads targets). Collective over the pipeline group.
  PipelineStepResult step(const at::Tensor& inputs, const at::Tensor& targets,
                          const PipelineLoss& loss, const OutputObserver& observe = {});

  /// Forward only (evaluation, no gradients): `inputs` in up to `microbatches` micro-batches
  /// through every stage; `observe` sees each output on the last stage. Collective over the
  /// pipeline group.
  void forward_only(const at::Tensor& inputs, const at::Tensor& targets,
                    const OutputObserver& observe);

  /// Clips the gradient of the whole model (all stages, a tied parameter counted once) to
  /// `max_norm` as torch::nn::utils::clip_grad_norm_ does on one process; returns the norm
  /// before clipping as a 0-dim float64 tensor, not read on the host (Note [Clipping on the
  /// device] in parallel/grad_clip.h). Collective over the pipeline group.
  at::Tensor clip_grad_norm(double max_norm);
  /// Names of this rank's parameters that another rank counts in that norm (its copies of
  /// tied parameters), for a strategy that computes the norm of its own gradient shards.
  const std::set<std::string>& counted_elsewhere() const;

  const Schedule& schedule() const { return schedule_; }
  /// The pipeline's communicator (its ranks run stages 0, 1, ... in order).
  comm::Communicator& group() const { return *pp_; }
  int num_stages() const { return num_stages_; }
  /// Whether this rank runs the last stage (the one that sees outputs and losses).
  bool holds_last_stage() const;
  const std::vector<std::shared_ptr<models::Model>>& stages() const { return stages_; }
  /// Where the stages' parameters are, and so where received activations and gradients go.
  at::Device device() const;

 private:
  struct Impl;
  std::vector<std::shared_ptr<models::Model>> stages_;
  std::shared_ptr<comm::Communicator> pp_;
  PipelineOptions opts_;
  Schedule schedule_;
  int num_stages_ = 0;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtorch::pp
