// cp::parallelize (context_parallel.h): hooks on the attention cores and the position table.
#include "dtorch/parallel/cp/context_parallel.h"

#include "dtorch/core/error.h"
#include "dtorch/models/module_hooks.h"
#include "dtorch/parallel/cp/attention.h"
#include "dtorch/parallel/cp/sequence_chunks.h"

namespace dtorch::cp {

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
  return shard_sequence(x, 1, group_->rank(), group_->size());
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
  auto result = std::make_shared<ContextParallel>(group, opts);
  bool positions = false;
  for (const auto& kv : model.named_modules("", /*include_self=*/false)) {
    torch::nn::Module* m = kv.value().get();
    models::ModuleHooks h;
    if (auto* core = dynamic_cast<models::AttentionCoreImpl*>(m)) {
      const bool causal = core->causal();
      const models::AttentionKernel kernel = core->kernel();
      if (opts.kind == Kind::Ring) {
        h.forward = [group, causal](torch::Tensor qkv) {
          return ring_attention(qkv, group, causal);
        };
      } else {
        h.forward = [group, causal, kernel](torch::Tensor qkv) {
          return ulysses_attention(qkv, group, causal, kernel);
        };
      }
    } else if (kv.key() == plan.positions) {
      positions = true;
      h.pre = [r, n](torch::Tensor local) {
        return global_positions(local.size(0), r, n, local.device());
      };
    } else {
      continue;
    }
    models::set_module_hooks(*m, std::move(h));
    result->hooked_.push_back(m);
  }
  DTORCH_CHECK_T(ConfigError, positions && result->hooked_.size() > 1,
                 "this model's context-parallel plan names the position table '", plan.positions,
                 "', and the model has ", positions ? "it but no attention core" : "no such module",
                 ": its plan does not fit it");
  return result;
}

}  // namespace dtorch::cp
