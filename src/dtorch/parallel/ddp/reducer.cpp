// Reducer: bucketed, overlapped gradient averaging for DDP (see reducer.h).
#include "dtorch/parallel/ddp/reducer.h"

#include <c10/util/strides.h>

#include <chrono>

#include "dtorch/core/error.h"

namespace dtorch::ddp {
namespace {

// Note [Gradient views]
// The buckets' flat buffers are the only gradient storage DDP keeps: as each gradient is
// absorbed, its parameter's .grad becomes an alias of its slice of the bucket (same memory;
// not an autograd view, so zero_grad's detach_() works), and the gradient autograd produced
// is freed at once instead of at the end of backward. Backward thus holds the buckets plus
// the gradients of the parameters whose hooks have not run yet, not two copies of every
// gradient (PyTorch's gradient_as_bucket_view). An optimizer that zeroes gradients in place
// keeps the views, so the next backward accumulates straight into the bucket and the hook
// copies nothing; one that sets them to undefined (dtorch's strategies, PyTorch 2's default)
// gets a fresh tensor from autograd, which the hook copies into the bucket: one write of each
// gradient where zeroing in place costs a memset and an add (a write and two reads more).

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

std::vector<size_t> bucket_of(const BucketPlan& plan) {
  std::vector<size_t> out;
  for (const auto& w : plan.where)
    out.push_back(w.first);
  return out;
}

// Buckets launch strictly in plan order (Note [Bucket order]).
std::vector<size_t> in_order(size_t n) {
  std::vector<size_t> out(n);
  for (size_t b = 0; b < n; ++b)
    out[b] = b;
  return out;
}

parallel::GradReadiness::Policy policy(const Options& opts) {
  parallel::GradReadiness::Policy p;
  p.who = "DDP";
  p.fill_unused = opts.find_unused_parameters;
  p.unused_hint =
      "Causes: 1) they are not used in forward for this input (pass "
      "find_unused_parameters=true, flag --find-unused-parameters); 2) the loss does not "
      "depend on the model's whole output; 3) they were frozen after wrap() (freeze before "
      "calling ddp::wrap)";
  p.twice_hint =
      "DDP supports one backward per synchronised step (use no_sync() for gradient "
      "accumulation)";
  return p;
}

}  // namespace

Reducer::Reducer(std::vector<at::Tensor> params, std::vector<std::string> names,
                 std::vector<at::Tensor> buffers, std::shared_ptr<comm::Communicator> comm,
                 const Options& opts)
    : params_(std::move(params)),
      buffers_(std::move(buffers)),
      comm_(std::move(comm)),
      opts_(opts),
      plan_(
          plan_buckets(specs_of(params_), mib(opts.first_bucket_cap_mb), mib(opts.bucket_cap_mb))),
      ready_(params_, std::move(names), bucket_of(plan_), in_order(plan_.buckets.size()),
             policy(opts),
             {[this](size_t i) { absorb(i); }, [this](size_t b) { launch(b); },
              [this](size_t n) { wait(n); }, [this] { complete(); }}) {
  for (const Bucket& b : plan_.buckets) {
    BucketState s;
    s.flat = at::zeros({b.numel}, at::TensorOptions().dtype(b.dtype).device(b.device));
    for (size_t j = 0; j < b.params.size(); ++j) {
      const at::Tensor& p = params_[b.params[j]];
      s.views.push_back(alias_of(s.flat, b.offsets[j], p.sizes()));
    }
    buckets_.push_back(std::move(s));
  }
}

Reducer::~Reducer() = default;

void Reducer::absorb(size_t index) {
  auto [b, pos] = plan_.where[index];
  at::Tensor& grad = params_[index].mutable_grad();
  const at::Tensor& view = buckets_[b].views[pos];
  if (grad.defined() && grad.is_same(view)) return;
  if (grad.defined()) {
    view.copy_(grad);  // Note [Gradient views]
  } else {
    view.zero_();
  }
  grad = view;
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

void Reducer::wait(size_t launched) {
  auto t0 = std::chrono::steady_clock::now();
  for (size_t b = 0; b < launched; ++b) {
    buckets_[b].work.wait();
    buckets_[b].work = comm::Work();
  }
  comm_wait_seconds_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void Reducer::complete() {
  for (BucketState& s : buckets_) {
    if (s.wire.defined()) {
      s.flat.copy_(s.wire);
      s.wire = at::Tensor();
    }
  }
  if (opts_.broadcast_buffers) {
    for (auto& buf : buffers_)
      comm_->broadcast(buf, 0, "DDP buffer broadcast");
  }
}

}  // namespace dtorch::ddp
