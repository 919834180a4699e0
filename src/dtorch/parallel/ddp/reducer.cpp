// Reducer: bucketed, overlapped gradient averaging for DDP (see reducer.h).
#include "dtorch/parallel/ddp/reducer.h"

#include <c10/util/strides.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <chrono>

#include "dtorch/core/error.h"

namespace dtorch::ddp {
namespace {

// Note [Gradient views]
// After each reduction a parameter's .grad is set to an alias of its slice of the bucket's
// flat buffer (same memory; not an autograd view, so zero_grad's detach_() works).
// Optimizers that zero gradients in place keep that view, so the next backward accumulates
// straight into the bucket and the hook copies nothing; an optimizer that sets gradients to
// undefined (set_to_none) gets a fresh tensor from autograd, which the hook copies into the
// bucket. Either way the reduced result lands in .grad with no extra copy.

class GradReadyHook : public torch::autograd::FunctionPostHook {
 public:
  GradReadyHook(Reducer* r, size_t index) : r_(r), index_(index) {}
  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    r_->on_grad_ready(index_);
    return outputs;
  }

 private:
  Reducer* r_;
  size_t index_;
};

std::vector<ParamSpec> specs_of(const std::vector<at::Tensor>& params) {
  std::vector<ParamSpec> specs;
  for (const auto& p : params)
    specs.push_back({p.numel(), p.scalar_type(), p.device()});
  return specs;
}

// A tensor sharing `flat`'s memory that autograd does not treat as a view: LibTorch's
// Optimizer::zero_grad calls detach_() on gradients, which autograd refuses on views.
at::Tensor alias_of(const at::Tensor& flat, int64_t offset, at::IntArrayRef sizes) {
  return at::empty({0}, flat.options())
      .set_(flat.storage(), flat.storage_offset() + offset, sizes, c10::contiguous_strides(sizes));
}

size_t mib(double x) {
  return static_cast<size_t>(x * 1024.0 * 1024.0);
}

}  // namespace

Reducer::Reducer(std::vector<at::Tensor> params, std::vector<std::string> names,
                 std::vector<at::Tensor> buffers, std::shared_ptr<comm::Communicator> comm,
                 const Options& opts)
    : params_(std::move(params)),
      names_(std::move(names)),
      buffers_(std::move(buffers)),
      comm_(std::move(comm)),
      opts_(opts),
      plan_(
          plan_buckets(specs_of(params_), mib(opts.first_bucket_cap_mb), mib(opts.bucket_cap_mb))),
      ready_(params_.size(), false) {
  for (const Bucket& b : plan_.buckets) {
    BucketState s;
    s.flat = at::zeros({b.numel}, at::TensorOptions().dtype(b.dtype).device(b.device));
    for (size_t j = 0; j < b.params.size(); ++j) {
      const at::Tensor& p = params_[b.params[j]];
      s.views.push_back(alias_of(s.flat, b.offsets[j], p.sizes()));
    }
    buckets_.push_back(std::move(s));
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(params_[i]);
    hook_keys_.push_back(acc->add_post_hook(std::make_unique<GradReadyHook>(this, i)));
    accumulators_.push_back(std::move(acc));
  }
}

Reducer::~Reducer() {
  for (size_t i = 0; i < accumulators_.size(); ++i)
    accumulators_[i]->del_post_hook(hook_keys_[i]);
}

void Reducer::reset_buckets() {
  in_backward_ = true;
  next_bucket_ = 0;
  std::fill(ready_.begin(), ready_.end(), false);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    buckets_[b].pending = plan_.buckets[b].params.size();
    buckets_[b].work = comm::Work();
  }
}

void Reducer::reduce_accumulated() {
  DTORCH_CHECK(sync_ && !in_backward_, "DDP: reduce_accumulated() runs after backward, outside ",
               "no_sync()");
  reset_buckets();
  for (size_t i = 0; i < params_.size(); ++i) {
    auto [b, pos] = plan_.where[i];
    const at::Tensor& grad = params_[i].grad();
    if (!grad.defined()) {
      buckets_[b].views[pos].zero_();
    } else if (!grad.is_same(buckets_[b].views[pos])) {
      buckets_[b].views[pos].copy_(grad);
    }
    ready_[i] = true;
    --buckets_[b].pending;
  }
  launch_ready_buckets();
  finalize();
}

void Reducer::prepare_for_backward() {
  reset_buckets();
  // Runs once the whole backward pass is done, on the thread that called backward().
  torch::autograd::Engine::get_default_engine().queue_callback([this] { finalize(); });
}

void Reducer::on_grad_ready(size_t index) {
  if (!sync_) return;  // no_sync: gradients just accumulate in .grad
  if (!in_backward_) prepare_for_backward();
  DTORCH_CHECK(!ready_[index], "parameter ", names_[index],
               " got its gradient twice in one backward pass; DDP supports one backward per "
               "synchronised step (use no_sync() for gradient accumulation)");
  ready_[index] = true;
  auto [b, pos] = plan_.where[index];
  BucketState& s = buckets_[b];
  const at::Tensor& grad = params_[index].grad();
  if (grad.defined() && !grad.is_same(s.views[pos])) {
    s.views[pos].copy_(grad);  // Note [Gradient views]
  }
  if (--s.pending == 0) launch_ready_buckets();
}

void Reducer::launch_ready_buckets() {
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
    launch(next_bucket_++);
  }
}

void Reducer::launch(size_t b) {
  BucketState& s = buckets_[b];
  std::string what = str("DDP gradient bucket ", b, " of ", buckets_.size());
  if (opts_.compression == Compression::None) {
    s.work = comm_->allreduce_async(s.flat, comm::ReduceOp::Avg, what);
    return;
  }
  // Divide before the cast so a half-precision sum cannot overflow.
  auto dtype = opts_.compression == Compression::FP16 ? at::kHalf : at::kBFloat16;
  s.wire = s.flat.div(comm_->size()).to(dtype);
  s.work = comm_->allreduce_async(s.wire, comm::ReduceOp::Sum, what);
}

void Reducer::fail_unready() {
  std::string names;
  int shown = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (ready_[i]) continue;
    if (shown++ < 8) names += (names.empty() ? "" : ", ") + names_[i];
  }
  if (shown > 8) names += str(" and ", shown - 8, " more");
  DTORCH_FAIL(Error, "DDP: parameter(s) ", names, " received no gradient in this backward pass. ",
              "Causes: 1) they are not used in forward for this input (pass "
              "find_unused_parameters=true, flag --find-unused-parameters); 2) the loss does "
              "not depend on the model's whole output; 3) they were frozen after wrap() "
              "(freeze before calling ddp::wrap)");
}

void Reducer::finalize() {
  in_backward_ = false;
  bool unready = next_bucket_ < buckets_.size();
  if (unready && opts_.find_unused_parameters) {
    // Unused parameters contribute zeros; the buckets launch in order as usual.
    for (size_t i = 0; i < params_.size(); ++i) {
      if (ready_[i]) continue;
      auto [b, pos] = plan_.where[i];
      const at::Tensor& grad = params_[i].grad();
      if (grad.defined() && !grad.is_same(buckets_[b].views[pos])) {
        buckets_[b].views[pos].copy_(grad);
      } else if (!grad.defined()) {
        buckets_[b].views[pos].zero_();
      }
      ready_[i] = true;
      --buckets_[b].pending;
    }
    launch_ready_buckets();
    unready = false;
  }
  auto t0 = std::chrono::steady_clock::now();
  for (size_t b = 0; b < next_bucket_; ++b)
    buckets_[b].work.wait();
  comm_wait_seconds_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (unready) fail_unready();

  for (size_t b = 0; b < buckets_.size(); ++b) {
    BucketState& s = buckets_[b];
    if (s.wire.defined()) {
      s.flat.copy_(s.wire);
      s.wire = at::Tensor();
    }
    for (size_t j = 0; j < s.views.size(); ++j) {
      at::Tensor& g = params_[plan_.buckets[b].params[j]].mutable_grad();
      if (!g.defined() || !g.is_same(s.views[j])) g = s.views[j];
    }
  }
  if (opts_.broadcast_buffers) {
    for (auto& buf : buffers_)
      comm_->broadcast(buf, 0, "DDP buffer broadcast");
  }
}

}  // namespace dtorch::ddp
