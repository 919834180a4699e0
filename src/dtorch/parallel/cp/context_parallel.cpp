// cp::parallelize (context_parallel.h): hooks on the attention cores and on the position
// table, or on the modules where a model's own sequence is split and gathered.
#include "dtorch/parallel/cp/context_parallel.h"

#include <torch/autograd.h>

#include "dtorch/core/error.h"
#include "dtorch/models/module_hooks.h"
#include "dtorch/parallel/autograd_group.h"
#include "dtorch/parallel/cp/attention.h"
#include "dtorch/parallel/cp/sequence_chunks.h"

namespace dtorch::cp {
namespace {

using torch::Tensor;

// The sequence whole again, its first `tokens`, from every rank's part (Note [Padded
// sequences]): an all-gather, whose adjoint is the reduce-scatter that gives each rank its own
// tokens' gradients summed over the group (every rank computes on the whole sequence after it).
struct GatherSequence : torch::autograd::Function<GatherSequence> {
  static Tensor forward(torch::autograd::AutogradContext* ctx, Tensor local, CommPtr group,
                        int64_t tokens) {
    parallel::keep_group(ctx, "cp", group);
    ctx->saved_data["tokens"] = tokens;
    std::vector<Tensor> parts;
    for (int r = 0; r < group->size(); ++r)
      parts.push_back(torch::empty_like(local, at::MemoryFormat::Contiguous));
    group->allgather(parts, local.contiguous(), "context-parallel sequence");
    return unshard_sequence(parts, 1).narrow(1, 0, tokens);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const CommPtr group = parallel::kept_group(ctx, "cp");
    const int n = group->size();
    const int64_t tokens = ctx->saved_data["tokens"].toInt();
    const Tensor g = torch::constant_pad_nd(grads[0], {0, 0, 0, padded_length(tokens, n) - tokens});
    std::vector<Tensor> parts;  // each rank's tokens of the gradient, in rank order
    for (int r = 0; r < n; ++r)
      parts.push_back(shard_sequence(g, 1, r, n).contiguous());
    Tensor mine = torch::empty_like(parts[group->rank()]);
    group->reduce_scatter(torch::cat(parts).view(-1), mine.view(-1), comm::ReduceOp::Sum,
                          "context-parallel sequence gradient");
    return {mine, Tensor(), Tensor()};
  }
};

}  // namespace

const NameTable<Kind>& names(Kind) {
  static const NameTable<Kind> n{{Kind::Ring, "ring"}, {Kind::Ulysses, "ulysses"}};
  return n;
}

LayerBytes bytes_sent_per_layer(Kind kind, int n, int64_t batch, int64_t heads,
                                int64_t local_tokens, int64_t head_dim, int64_t element_bytes) {
  const int64_t one = batch * heads * local_tokens * head_dim;  // q, k, v or the output
  if (kind == Kind::Ring) {
    const int64_t kv = 2 * one * element_bytes;
    const int64_t gradients = 2 * one * (element_bytes == 8 ? 8 : 4);  // float32 or float64
    return {(n - 1) * kv, (n - 1) * kv + (n > 1 ? n * gradients : 0)};
  }
  const int64_t each_way = (n - 1) * 4 * one * element_bytes / n;
  return {each_way, each_way};
}

ContextParallel::~ContextParallel() {
  for (auto* m : hooked_)
    models::clear_module_hooks(*m);
}

torch::Tensor ContextParallel::shard(const torch::Tensor& x) const {
  if (plan_.positions.empty()) return x;
  return shard_sequence(x, 1, group_->rank(), group_->size());
}

int64_t ContextParallel::local_length(int64_t input_tokens) const {
  const int n = group_->size();
  return padded_length(plan_.positions.empty() ? plan_.tokens : input_tokens, n) / n;
}

std::shared_ptr<ContextParallel> parallelize(models::Model& model,
                                             std::shared_ptr<comm::Communicator> group,
                                             Options opts) {
  const models::Model::ContextPlan plan = model.context_parallel_plan();
  const int n = group->size(), r = group->rank();
  if (opts.kind == Kind::Ulysses) {
    DTORCH_CHECK_T(
        ConfigError, plan.heads % opts.tp == 0 && (plan.heads / opts.tp) % n == 0,
        "--cp-kind ulysses gives each of the ", n, " context-parallel ranks 1/", n, " of the ",
        plan.heads, " attention heads",
        opts.tp > 1 ? str(" (", plan.heads / opts.tp, " per tensor-parallel rank)") : std::string(),
        ", which do not divide: use --cp-kind ring, or a --cp that divides ", plan.heads / opts.tp);
  }
  auto result = std::make_shared<ContextParallel>(group, opts, plan);
  const int64_t tokens = plan.tokens;  // 0: the input's sequence, never padded
  int found = 0;                       // of the modules the plan names
  for (const auto& kv : model.named_modules("", /*include_self=*/false)) {
    torch::nn::Module* m = kv.value().get();
    models::ModuleHooks h;
    if (auto* core = dynamic_cast<models::AttentionCoreImpl*>(m)) {
      const bool causal = core->causal();
      const models::AttentionKernel kernel = core->kernel();
      if (opts.kind == Kind::Ring) {
        h.forward = [group, causal, tokens](torch::Tensor qkv) {
          return ring_attention(qkv, group, causal, tokens);
        };
      } else {
        h.forward = [group, causal, kernel, tokens](torch::Tensor qkv) {
          return ulysses_attention(qkv, group, causal, kernel, tokens);
        };
      }
    } else if (kv.key() == plan.positions) {
      ++found;
      h.pre = [r, n](torch::Tensor local) {
        return global_positions(local.size(0), r, n, local.device());
      };
    } else if (kv.key() == plan.split) {
      ++found;
      h.pre = [r, n, tokens](torch::Tensor whole) {  // B x tokens x C
        DTORCH_CHECK(whole.size(1) == tokens, "the sequence split has ", whole.size(1),
                     " tokens, its plan ", tokens);
        whole = torch::constant_pad_nd(whole, {0, 0, 0, padded_length(tokens, n) - tokens});
        return shard_sequence(whole, 1, r, n);
      };
    } else if (kv.key() == plan.gather) {
      ++found;
      h.pre = [group, tokens](torch::Tensor local) {
        return GatherSequence::apply(local, group, tokens);
      };
    } else {
      continue;
    }
    DTORCH_CHECK(models::module_hooks(*m) == nullptr, "context parallelism hooks module '",
                 kv.key(), "', which another parallelism hooks already");
    models::set_module_hooks(*m, std::move(h));
    result->hooked_.push_back(m);
  }
  const int named = plan.positions.empty() ? 2 : 1;
  const std::string modules = plan.positions.empty()
                                  ? str("'", plan.split, "' and '", plan.gather, "'")
                                  : str("the position table '", plan.positions, "'");
  DTORCH_CHECK_T(ConfigError, found == named && int(result->hooked_.size()) > named,
                 "this model's context-parallel plan names ", modules, ", and the model has ",
                 found == named ? "them but no attention core" : "not all of them",
                 ": its plan does not fit it");
  return result;
}

}  // namespace dtorch::cp
