// train::step() (step.h): the step without and with a pipeline.
#include "dtorch/train/step.h"

#include "dtorch/core/trace_range.h"
#include "dtorch/parallel/autocast.h"
#include "dtorch/train/loss.h"

namespace dtorch::train {
namespace {

void lap(const StepOptions& o, const char* phase) {
  if (o.lap) o.lap(phase);
}

void update(const Parallelized& run, const StepOptions& o) {
  TraceRange range("optimizer");
  if (o.before_update) o.before_update();
  run.strategy->step(o.clip_grad_norm);  // under a pipeline the norm spans every stage
}

// Note [Pipeline execution] under the strategy: every micro-batch's backward accumulates, then
// the strategy reduces over the dp group once. The loss, which the last stage computed, is
// summed over the pp group so every rank returns it.
torch::Tensor pipeline_step(const Parallelized& run, const torch::Tensor& x, const torch::Tensor& y,
                            const StepOptions& o) {
  pp::Pipeline& pipeline = *run.layout.pp.pipeline;
  Strategy& strategy = *run.strategy;
  const tp::TensorParallel* tensor_parallel = run.layout.tp.handle.get();
  pp::PipelineStepResult r;
  // The pipeline runs backward itself, so the loss it differentiates carries fp16's scale.
  const double scale = strategy.loss_scale();
  strategy.backward_accumulated([&] {
    TraceRange range("forward_backward");
    parallel::Autocast autocast(strategy.autocast());
    r = pipeline.step(x, y, [&](const torch::Tensor& out, const torch::Tensor& t) {
      return cross_entropy(out, t, tensor_parallel) * scale;
    });
  });
  lap(o, "forward_backward");
  update(run, o);
  lap(o, "step");
  auto loss = torch::tensor({r.has_loss ? r.loss / scale : 0.0}, torch::kDouble);
  pipeline.group().allreduce(loss, comm::ReduceOp::Sum, "pipeline loss");
  return loss.squeeze(0);
}

}  // namespace

torch::Tensor step(const Parallelized& run, const torch::Tensor& x, const torch::Tensor& y,
                   const StepOptions& o) {
  if (run.layout.pp.pipeline) return pipeline_step(run, x, y, o);
  Strategy& strategy = *run.strategy;
  torch::Tensor loss;
  {
    TraceRange range("forward");
    parallel::Autocast autocast(strategy.autocast());
    loss = cross_entropy(run.model->forward(run.layout.local_tokens(x)), run.layout.local_tokens(y),
                         run.layout.tp.handle.get());
  }
  lap(o, "forward");
  {
    TraceRange range("backward");
    strategy.backward(loss / o.accum_steps, o.update);
  }
  lap(o, "backward");
  if (o.update) {
    update(run, o);
    lap(o, "step");
  }
  return loss.detach();
}

}  // namespace dtorch::train
