// Applying a tensor-parallel plan: parameters resharded in place, module hooks that route
// activations through the regions of Note [Tensor-parallel regions], and the full state dict
// gathered back for checkpoints and parity checks.
#include "dtorch/parallel/tp/tensor_parallel.h"

#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include <set>

#include "dtorch/core/error.h"
#include "dtorch/core/storage.h"
#include "dtorch/models/module_hooks.h"
#include "dtorch/models/unit_seeds.h"
#include "dtorch/parallel/activation_checkpoint.h"
#include "dtorch/parallel/tp/regions.h"

namespace dtorch::tp {

torch::Tensor shard_of(const torch::Tensor& full, const ShardSpec& spec, int r, int n) {
  const int64_t size = full.size(spec.dim);
  DTORCH_CHECK_T(ConfigError, size % (spec.fused * n) == 0, "a tensor of size ", size,
                 " along dim ", spec.dim, " cannot be split into ", spec.fused, " x ", n,
                 " equal slices");
  std::vector<torch::Tensor> mine;
  for (const auto& part : full.chunk(spec.fused, spec.dim))
    mine.push_back(part.chunk(n, spec.dim)[r]);
  return torch::cat(mine, spec.dim);
}

torch::Tensor unshard(const std::vector<torch::Tensor>& shards, const ShardSpec& spec) {
  std::vector<torch::Tensor> parts;
  for (int64_t f = 0; f < spec.fused; ++f) {
    std::vector<torch::Tensor> pieces;
    for (const auto& s : shards)
      pieces.push_back(s.chunk(spec.fused, spec.dim)[f]);
    parts.push_back(torch::cat(pieces, spec.dim));
  }
  return torch::cat(parts, spec.dim);
}

namespace {

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

// Note [Deferred initialisation], tensor parallelism's half: a model built without memory
// gets its values here, once its split parameters have their shard's shape. Its units are
// built again one at a time from the generator state the model was built from, and each rank
// copies its shard of every split parameter and the whole of the others, so no rank holds
// more than one unit beyond its own parameters. Every tp rank built the model from the same
// seed, so they agree without a broadcast (DDP or ZeRO then broadcast over the dp group).
void fill_deferred(models::Model& model, const std::map<std::string, ShardSpec>& sharded, int r,
                   int n) {
  auto params = model.named_parameters();
  std::set<std::string> filled;
  {
    models::GeneratorStateGuard keep;
    models::set_cpu_generator_state(model.deferred_init().generator_state);
    model.deferred_init().for_each_unit([&](models::Model& unit) {
      for (const auto& kv : unit.named_parameters()) {
        torch::Tensor* mine = params.find(kv.key());
        DTORCH_CHECK(mine, "tensor parallelism: a unit of the deferred model has parameter ",
                     kv.key(), ", which the model itself does not");
        auto it = sharded.find(kv.key());
        torch::Tensor value =
            it == sharded.end() ? kv.value() : shard_of(kv.value(), it->second, r, n);
        if (!holds_storage(*mine)) restore_storage(*mine, mine->nbytes());
        // A parameter two units build (a GPT's tied embedding) gets the same values twice.
        mine->detach().copy_(value);
        filled.insert(kv.key());
      }
    });
  }
  for (const auto& kv : params)
    DTORCH_CHECK(filled.count(kv.key()), "tensor parallelism: no unit of the deferred model ",
                 "built parameter ", kv.key());
  model.set_deferred_init({});
}

}  // namespace

TensorParallel::~TensorParallel() {
  for (auto* m : hooked_) {
    models::edit_module_hooks(*m, [](models::ModuleHooks& h) {
      h.pre = h.forward = h.post = nullptr;  // a unit's `around` stays (Note [Your own model])
    });
  }
}

std::shared_ptr<TensorParallel> parallelize(models::Model& model,
                                            std::shared_ptr<comm::Communicator> tp,
                                            const Plan& plan, Options opts) {
  const bool deferred = model.deferred();
  auto result = std::make_shared<TensorParallel>(tp, opts);
  TensorParallel& t = *result;
  const int n = tp->size(), r = tp->rank();
  const bool sp = opts.sequence_parallel;
  torch::NoGradGuard no_grad;
  // Hooks are gathered per module first: one module may get several (a one-block model's
  // block is both first and last).
  std::map<torch::nn::Module*, models::ModuleHooks> hooks;
  bool head_enters_region = false;
  int64_t vocab_start = 0;

  auto split = [&](const std::string& name, torch::Tensor p, ShardSpec spec) {
    DTORCH_CHECK_T(ConfigError, p.size(spec.dim) % (spec.fused * n) == 0, name, " has ",
                   p.size(spec.dim), " entries along dim ", spec.dim,
                   spec.fused > 1 ? str(" in ", spec.fused, " parts") : std::string(),
                   ": tensor parallelism over ", n, " ranks needs a multiple of ", spec.fused * n);
    if (deferred) {  // only the shard's shape: fill_deferred gives it its values
      std::vector<int64_t> sizes = p.sizes().vec();
      sizes[spec.dim] /= n;
      p.set_data(at::empty(sizes, p.options()));
    } else {
      p.set_data(shard_of(p, spec, r, n).clone());
    }
    t.sharded_[name] = spec;
  };

  for (const Rule& rule : plan) {
    int hits = 0;
    for (const auto& kv : model.named_modules("", /*include_self=*/false)) {
      const std::string& path = kv.key();
      if (!models::module_path_matches(rule.module, path)) continue;
      ++hits;
      torch::nn::Module* m = kv.value().get();
      models::ModuleHooks& h = hooks[m];
      auto not_fit = [&](const char* what) {
        DTORCH_FAIL(ConfigError, "tensor-parallel rule '", rule.module, "' (",
                    to_string(rule.style), ") matched ", path, ", which is not ", what);
      };
      switch (rule.style) {
        case Style::Colwise: {
          auto params = m->named_parameters(/*recurse=*/false);
          if (params.is_empty()) not_fit("a module with its own weight");
          for (const auto& p : params)
            split(path + "." + p.key(), p.value(), {0, rule.fused});
          h.pre = sp ? std::function<torch::Tensor(torch::Tensor)>(
                           [tp](torch::Tensor x) { return gather_from_sequence(x, tp, true); })
                     : [tp](torch::Tensor x) { return copy_to_region(x, tp); };
          break;
        }
        case Style::Rowwise: {
          auto* lin = dynamic_cast<torch::nn::LinearImpl*>(m);
          if (!lin) not_fit("a Linear");
          split(path + ".weight", lin->weight, {1, 1});
          // The module outlives every call of its hook (call() holds it): a raw pointer,
          // so that the hook table never keeps a model alive.
          h.forward = [lin, tp, sp](torch::Tensor x) {
            torch::Tensor y = torch::linear(x, lin->weight);
            y = sp ? reduce_scatter_to_sequence(y, tp) : reduce_from_region(y, tp);
            return lin->bias.defined() ? y + lin->bias : y;
          };
          break;
        }
        case Style::VocabEmbedding: {
          auto* emb = dynamic_cast<torch::nn::EmbeddingImpl*>(m);
          if (!emb) not_fit("an Embedding");
          const int64_t rows = emb->weight.size(0) / n, lo = r * rows;
          split(path + ".weight", emb->weight, {0, 1});
          t.vocab_rows_ = rows;
          vocab_start = lo;
          h.forward = [emb, tp, lo, rows](torch::Tensor idx) {
            torch::Tensor local = idx - lo;
            torch::Tensor outside = (local < 0) | (local >= rows);
            torch::Tensor y = torch::embedding(emb->weight, local.masked_fill(outside, 0));
            return reduce_from_region(y.masked_fill(outside.unsqueeze(-1), 0), tp);
          };
          break;
        }
        case Style::EnterVocabRegion:
          head_enters_region = true;
          h.post = [tp](torch::Tensor y) { return copy_to_region(y, tp); };
          break;
        case Style::SequenceScatter:
          if (sp) h.pre = [tp](torch::Tensor x) { return scatter_to_sequence(x, tp); };
          break;
        case Style::SequenceGather:
          if (sp) h.post = [tp](torch::Tensor y) { return gather_from_sequence(y, tp, false); };
          break;
      }
    }
    DTORCH_CHECK_T(ConfigError, hits > 0, "tensor-parallel rule '", rule.module, "' (",
                   to_string(rule.style), ") matches no module of this model");
  }
  // A pipeline stage may hold the split embedding without the head (Note [Pipeline units]).
  DTORCH_CHECK_T(ConfigError,
                 head_enters_region ? t.vocab_rows_ > 0 : (t.vocab_rows_ == 0 || !model.whole()),
                 "a tensor-parallel plan with a vocabulary-split embedding needs the module "
                 "feeding the tied head marked enter-vocab-region, and the other way round");
  t.vocab_output_ = head_enters_region;
  t.vocab_start_ = vocab_start;
  if (deferred) fill_deferred(model, t.sharded_, r, n);
  for (auto& kv : hooks) {
    if (!kv.second.pre && !kv.second.forward && !kv.second.post) continue;
    models::edit_module_hooks(*kv.first, [&](models::ModuleHooks& h) {
      h.pre = kv.second.pre;
      h.forward = kv.second.forward;
      h.post = kv.second.post;
    });
    t.hooked_.push_back(kv.first);
  }

  // Under sequence parallelism a replicated parameter inside the blocks (norms, row-parallel
  // biases) sees only this rank's tokens: its gradient is a partial sum over the group.
  if (sp) {
    for (const auto& kv : model.named_parameters()) {
      if (t.sharded_.count(kv.key())) continue;
      bool in_block = false;
      for (const auto& b : model.block_names())
        in_block = in_block || starts_with(kv.key(), b + ".");
      if (!in_block) continue;
      t.partial_.push_back(kv.key());
      kv.value().register_hook([tp](torch::Tensor g) {
        // Once, as the engine accumulates it (Note [Activation checkpointing]).
        if (parallel::taking_block_gradients()) return g;
        torch::Tensor sum = g.contiguous().clone();
        tp->allreduce(sum, comm::ReduceOp::Sum, "sequence-parallel parameter gradient");
        return sum;
      });
    }
  }
  return result;
}

torch::Tensor TensorParallel::vocab_cross_entropy(const torch::Tensor& logits,
                                                  const torch::Tensor& target) const {
  DTORCH_CHECK(vocab_parallel_output(), "vocab_cross_entropy: the model's output is not split ",
               "by vocabulary; use plain cross-entropy");
  return vocab_parallel_cross_entropy(logits.reshape({-1, logits.size(-1)}), target.reshape({-1}),
                                      tp_, vocab_start_);
}

int64_t TensorParallel::vocab_correct(const torch::Tensor& logits,
                                      const torch::Tensor& target) const {
  DTORCH_CHECK(vocab_parallel_output(),
               "vocab_correct: the model's output is not split by "
               "vocabulary");
  torch::Tensor l = logits.reshape({-1, logits.size(-1)}).to(torch::kFloat);
  torch::Tensor best = std::get<0>(l.max(1)).contiguous();
  tp_->allreduce(best, comm::ReduceOp::Max, "vocab-parallel accuracy maxima");
  torch::Tensor local = target.reshape({-1}) - vocab_start_;
  torch::Tensor mine = (local >= 0) & (local < vocab_rows_);
  torch::Tensor at_target = l.gather(1, local.clamp(0, vocab_rows_ - 1).unsqueeze(1)).squeeze(1);
  torch::Tensor hits = (mine & (at_target >= best)).sum().to(torch::kLong).reshape({1});
  tp_->allreduce(hits, comm::ReduceOp::Sum, "vocab-parallel accuracy");
  return hits.item<int64_t>();
}

torch::OrderedDict<std::string, torch::Tensor> TensorParallel::full_state_dict(
    torch::nn::Module& model) const {
  torch::OrderedDict<std::string, torch::Tensor> out;
  for (const auto& kv : model.named_parameters()) {
    torch::Tensor local = kv.value().detach();
    auto it = sharded_.find(kv.key());
    if (it == sharded_.end()) {
      out.insert(kv.key(), local.clone());
      continue;
    }
    std::vector<torch::Tensor> shards;
    for (int i = 0; i < tp_->size(); ++i)
      shards.push_back(torch::empty_like(local));
    tp_->allgather(shards, local.contiguous(), "gathering " + kv.key());
    out.insert(kv.key(), unshard(shards, it->second));
  }
  for (const auto& kv : model.named_buffers())
    out.insert(kv.key(), kv.value().detach().clone());
  return out;
}

void TensorParallel::load_into(torch::nn::Module& full, torch::nn::Module& model) const {
  auto state = full_state_dict(model);
  torch::NoGradGuard no_grad;
  auto copy = [&](const std::string& name, torch::Tensor dst) {
    const torch::Tensor* src = state.find(name);
    DTORCH_CHECK_T(ConfigError, src && src->sizes() == dst.sizes(), "the unsplit model's ", name,
                   " does not fit the tensor-parallel model's");
    dst.copy_(*src);
  };
  for (const auto& kv : full.named_parameters())
    copy(kv.key(), kv.value());
  for (const auto& kv : full.named_buffers())
    copy(kv.key(), kv.value());
}

void TensorParallel::load_from(torch::nn::Module& model, torch::nn::Module& full) const {
  torch::NoGradGuard no_grad;
  const auto params = full.named_parameters(), buffers = full.named_buffers();
  auto load = [&](const std::string& name, torch::Tensor dst) {
    const torch::Tensor* src = params.find(name);
    if (!src) src = buffers.find(name);
    DTORCH_CHECK_T(ConfigError, src, "the unsplit model has no ", name);
    auto it = sharded_.find(name);
    torch::Tensor mine =
        it == sharded_.end() ? *src : shard_of(*src, it->second, tp_->rank(), tp_->size());
    DTORCH_CHECK_T(ConfigError, mine.sizes() == dst.sizes(), name, " is ", src->sizes(),
                   " in the unsplit model, which does not fit this one (",
                   it == sharded_.end() ? "" : "tensor-parallel shard ", dst.sizes(), ")");
    dst.copy_(mine);
  };
  for (const auto& kv : model.named_parameters())
    load(kv.key(), kv.value());
  for (const auto& kv : model.named_buffers())
    load(kv.key(), kv.value());
}

}  // namespace dtorch::tp
