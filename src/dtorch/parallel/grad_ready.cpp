// GradReadiness: gradient-ready hooks, per-group pending counts, in-order launch and the end
// of backward, shared by DDP and ZeRO (Note [Gradient readiness] in grad_ready.h).
#include "dtorch/parallel/grad_ready.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "dtorch/core/error.h"

namespace dtorch::parallel {
namespace {

class GradReadyHook : public torch::autograd::FunctionPostHook {
 public:
  GradReadyHook(GradReadiness* r, size_t index) : r_(r), index_(index) {}
  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    r_->on_grad_ready(index_);
    return outputs;
  }

 private:
  GradReadiness* r_;
  size_t index_;
};

}  // namespace

GradReadiness::GradReadiness(std::vector<at::Tensor> params, std::vector<std::string> names,
                             std::vector<size_t> group_of, std::vector<size_t> launch_order,
                             Policy policy, Callbacks callbacks)
    : params_(std::move(params)),
      names_(std::move(names)),
      group_of_(std::move(group_of)),
      launch_order_(std::move(launch_order)),
      policy_(std::move(policy)),
      callbacks_(std::move(callbacks)),
      group_size_(launch_order_.size(), 0),
      ready_(params_.size(), false) {
  DTORCH_CHECK(names_.size() == params_.size() && group_of_.size() == params_.size(),
               "GradReadiness: one name and one group per parameter");
  for (size_t g : group_of_) {
    DTORCH_CHECK(g < group_size_.size(), "GradReadiness: group ", g, " is not in the launch order");
    ++group_size_[g];
  }
  pending_ = group_size_;
  for (size_t i = 0; i < params_.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(params_[i]);
    hook_keys_.push_back(acc->add_post_hook(std::make_unique<GradReadyHook>(this, i)));
    accumulators_.push_back(std::move(acc));
  }
}

GradReadiness::~GradReadiness() {
  for (size_t i = 0; i < accumulators_.size(); ++i)
    accumulators_[i]->del_post_hook(hook_keys_[i]);
}

void GradReadiness::prepare_for_backward() {
  in_backward_ = true;
  next_launch_ = 0;
  std::fill(ready_.begin(), ready_.end(), false);
  pending_ = group_size_;
}

void GradReadiness::on_grad_ready(size_t i) {
  if (!sync_) return;
  if (!in_backward_) {
    prepare_for_backward();
    // Runs once the whole backward pass is done, on the thread that called backward().
    torch::autograd::Engine::get_default_engine().queue_callback([this] { finalize(); });
  }
  DTORCH_CHECK(!ready_[i], policy_.who, ": parameter ", names_[i],
               " got its gradient twice in one backward pass; ", policy_.twice_hint);
  callbacks_.absorb(i);
  mark_ready(i);
  launch_ready();
}

void GradReadiness::mark_ready(size_t i) {
  ready_[i] = true;
  --pending_[group_of_[i]];
}

void GradReadiness::launch_ready() {
  while (next_launch_ < launch_order_.size() && pending_[launch_order_[next_launch_]] == 0)
    callbacks_.launch(launch_order_[next_launch_++]);
}

void GradReadiness::reduce_accumulated() {
  DTORCH_CHECK(sync_ && !in_backward_, policy_.who,
               ": reduce_accumulated() runs after backward, outside no_sync()");
  prepare_for_backward();
  for (size_t i = 0; i < params_.size(); ++i) {
    callbacks_.absorb(i);
    mark_ready(i);
  }
  launch_ready();
  finalize();
}

void GradReadiness::finalize() {
  in_backward_ = false;
  if (next_launch_ < launch_order_.size() && policy_.fill_unused) {
    for (size_t i = 0; i < params_.size(); ++i) {
      if (ready_[i]) continue;
      callbacks_.absorb(i);
      mark_ready(i);
    }
    launch_ready();
  }
  // Wait even when failing: what was launched is in flight on the other ranks too.
  callbacks_.wait(next_launch_);
  if (next_launch_ < launch_order_.size()) fail_unready();
  callbacks_.complete();
}

void GradReadiness::fail_unready() const {
  std::string names;
  int shown = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (ready_[i]) continue;
    if (shown++ < 8) names += (names.empty() ? "" : ", ") + names_[i];
  }
  if (shown > 8) names += str(" and ", shown - 8, " more");
  DTORCH_FAIL(Error, policy_.who, ": parameter(s) ", names,
              " received no gradient in this backward pass. ", policy_.unused_hint);
}

}  // namespace dtorch::parallel
