// Note [Tensor-parallel regions]: each mapping is a torch::autograd::Function whose backward is
// the adjoint collective of its forward. The communicator travels in the autograd context
// (parallel/autograd_group.h), so a graph keeps its group alive until backward has run.
#include "dtorch/parallel/tp/regions.h"

#include <torch/autograd.h>

#include "dtorch/core/error.h"
#include "dtorch/parallel/autograd_group.h"

namespace dtorch::tp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

void hold(AutogradContext* ctx, const CommPtr& c) {
  parallel::keep_group(ctx, "tp", c);
}

CommPtr held(AutogradContext* ctx) {
  return parallel::kept_group(ctx, "tp");
}

int64_t slice_length(const torch::Tensor& x, const CommPtr& tp) {
  const int64_t T = x.size(1), n = tp->size();
  DTORCH_CHECK_T(ConfigError, T % n == 0, "sequence parallelism splits the sequence (", T,
                 " tokens) across ", n, " tensor-parallel ranks: use a sequence length that ",
                 "is a multiple of ", n, ", or turn sequence parallelism off");
  return T / n;
}

// B x t x ... on each rank -> B x (n t) x ..., rank r's block at r t.
torch::Tensor allgather_sequence(const torch::Tensor& x, const CommPtr& tp, const char* what) {
  const int64_t n = tp->size();
  torch::Tensor seq_first = x.transpose(0, 1).contiguous();
  auto sizes = seq_first.sizes().vec();
  sizes[0] *= n;
  torch::Tensor out = torch::empty(sizes, seq_first.options());
  tp->allgather_into(out, seq_first, what);
  return out.transpose(0, 1).contiguous();
}

// B x T x ... summed over ranks, rank r keeping tokens [r T/n, (r+1) T/n).
torch::Tensor reduce_scatter_sequence(const torch::Tensor& x, const CommPtr& tp, const char* what) {
  const int64_t t = slice_length(x, tp);
  torch::Tensor seq_first = x.transpose(0, 1).contiguous();
  auto sizes = seq_first.sizes().vec();
  sizes[0] = t;
  torch::Tensor out = torch::empty(sizes, seq_first.options());
  tp->reduce_scatter(seq_first.view({-1}), out.view({-1}), comm::ReduceOp::Sum, what);
  return out.transpose(0, 1).contiguous();
}

torch::Tensor my_slice(const torch::Tensor& x, const CommPtr& tp) {
  const int64_t t = slice_length(x, tp);
  return x.narrow(1, tp->rank() * t, t).contiguous();
}

torch::Tensor allreduced(const torch::Tensor& x, const CommPtr& tp, const char* what) {
  torch::Tensor y = x.contiguous().clone();
  tp->allreduce(y, comm::ReduceOp::Sum, what);
  return y;
}

struct CopyToRegion : torch::autograd::Function<CopyToRegion> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, CommPtr tp) {
    hold(ctx, tp);
    return x;
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {allreduced(g[0], held(ctx), "tensor-parallel input gradient"), torch::Tensor()};
  }
};

struct ReduceFromRegion : torch::autograd::Function<ReduceFromRegion> {
  static torch::Tensor forward(AutogradContext*, torch::Tensor x, CommPtr tp) {
    return allreduced(x, tp, "tensor-parallel output");
  }
  static variable_list backward(AutogradContext*, variable_list g) {
    return {g[0], torch::Tensor()};
  }
};

struct ScatterToSequence : torch::autograd::Function<ScatterToSequence> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, CommPtr tp) {
    hold(ctx, tp);
    return my_slice(x, tp);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {allgather_sequence(g[0], held(ctx), "sequence-parallel gradient"), torch::Tensor()};
  }
};

struct GatherFromSequence : torch::autograd::Function<GatherFromSequence> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, CommPtr tp,
                               bool grad_is_partial) {
    hold(ctx, tp);
    ctx->saved_data["partial"] = grad_is_partial;
    return allgather_sequence(x, tp, "sequence-parallel input");
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    CommPtr tp = held(ctx);
    torch::Tensor dx = ctx->saved_data["partial"].toBool()
                           ? reduce_scatter_sequence(g[0], tp, "sequence-parallel gradient")
                           : my_slice(g[0], tp);
    return {dx, torch::Tensor(), torch::Tensor()};
  }
};

struct ReduceScatterToSequence : torch::autograd::Function<ReduceScatterToSequence> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, CommPtr tp) {
    hold(ctx, tp);
    return reduce_scatter_sequence(x, tp, "sequence-parallel output");
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {allgather_sequence(g[0], held(ctx), "sequence-parallel gradient"), torch::Tensor()};
  }
};

// Megatron's _VocabParallelCrossEntropy: log-sum-exp over the whole vocabulary from per-rank
// partial maxima and sums; the target's logit comes from the one rank holding its row.
struct VocabParallelCrossEntropy : torch::autograd::Function<VocabParallelCrossEntropy> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor logits, torch::Tensor target,
                               CommPtr tp, int64_t vocab_start) {
    torch::Tensor l = logits.to(torch::kFloat);
    const int64_t rows = l.size(1);
    torch::Tensor max = std::get<0>(l.max(1)).contiguous();
    tp->allreduce(max, comm::ReduceOp::Max, "vocab-parallel loss maxima");
    torch::Tensor shifted = l - max.unsqueeze(1);
    torch::Tensor e = shifted.exp();
    torch::Tensor local = target - vocab_start;
    torch::Tensor mine = (local >= 0) & (local < rows);
    torch::Tensor index = local.clamp(0, rows - 1).unsqueeze(1);
    torch::Tensor picked = shifted.gather(1, index).squeeze(1) * mine.to(torch::kFloat);
    torch::Tensor sums = torch::stack({e.sum(1), picked}).contiguous();
    tp->allreduce(sums, comm::ReduceOp::Sum, "vocab-parallel loss sums");
    torch::Tensor loss = (sums[0].log() - sums[1]).mean();
    ctx->save_for_backward({e / sums[0].unsqueeze(1), index, mine});
    ctx->saved_data["dtype"] = static_cast<int64_t>(logits.scalar_type());
    return loss;
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    auto saved = ctx->get_saved_variables();
    torch::Tensor grad = saved[0].clone();
    grad.scatter_add_(1, saved[1], -saved[2].to(torch::kFloat).unsqueeze(1));
    grad.mul_(g[0] / grad.size(0));
    auto dtype = static_cast<torch::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {grad.to(dtype), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits, const torch::Tensor& target,
                                           const CommPtr& tp, int64_t vocab_start) {
  DTORCH_CHECK(logits.dim() == 2 && target.dim() == 1 && logits.size(0) == target.size(0),
               "vocab_parallel_cross_entropy takes N x V/tp logits and N targets, got ",
               logits.sizes(), " and ", target.sizes());
  return VocabParallelCrossEntropy::apply(logits, target, tp, vocab_start);
}

torch::Tensor copy_to_region(const torch::Tensor& x, const CommPtr& tp) {
  return CopyToRegion::apply(x, tp);
}

torch::Tensor reduce_from_region(const torch::Tensor& x, const CommPtr& tp) {
  return ReduceFromRegion::apply(x, tp);
}

torch::Tensor scatter_to_sequence(const torch::Tensor& x, const CommPtr& tp) {
  return ScatterToSequence::apply(x, tp);
}

torch::Tensor gather_from_sequence(const torch::Tensor& x, const CommPtr& tp,
                                   bool grad_is_partial) {
  return GatherFromSequence::apply(x, tp, grad_is_partial);
}

torch::Tensor reduce_scatter_to_sequence(const torch::Tensor& x, const CommPtr& tp) {
  return ReduceScatterToSequence::apply(x, tp);
}

}  // namespace dtorch::tp
