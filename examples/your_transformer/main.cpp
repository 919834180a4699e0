// Your own transformer, written with LibTorch modules only, trained with dtorch's parallelisms
// (docs/your-model.md). On 4 local ranks:
//   dtorch launch --nproc-per-node 4 -- ./your_transformer --zero3 --tp 2 --ac
//     (ZeRO-3 over 2 data-parallel ranks x tensor parallelism over 2, blocks recomputed)
//   dtorch launch --nproc-per-node 4 -- ./your_transformer --pp 2
//     (2 pipeline stages x DDP over 2)
//   ./your_transformer
//     (one process: the same losses, step by step)
#include <dtorch/models/module_hooks.h>
#include <dtorch/models/registry.h>
#include <dtorch/models/wrapped_module.h>
#include <dtorch/train/step.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <string>

namespace nn = torch::nn;
using dtorch::models::call;

// ---- 1. The model: LibTorch modules. What dtorch needs of it is that each module a
// parallelism may wrap, split or skip runs through call(child, x) (Note [Module hooks]). ----

constexpr int64_t kVocab = 32, kWidth = 32, kHeadDim = 8, kDepth = 4, kContext = 16;

// Token and position embeddings.
struct EmbedImpl : nn::Module {
  EmbedImpl() {
    tokens = register_module("tokens", nn::Embedding(kVocab, kWidth));
    positions = register_module("positions", nn::Embedding(kContext, kWidth));
  }
  torch::Tensor forward(torch::Tensor ids) {
    return tokens(ids) + positions(torch::arange(ids.size(1), ids.options()));
  }
  nn::Embedding tokens{nullptr}, positions{nullptr};
};
TORCH_MODULE(Embed);

// Causal self-attention. Its heads come from qkv's output, not from a constant: under tensor
// parallelism each rank holds 1/tp of them.
struct AttentionImpl : nn::Module {
  AttentionImpl() {
    qkv = register_module("qkv", nn::Linear(kWidth, 3 * kWidth));
    out = register_module("out", nn::Linear(kWidth, kWidth));
  }
  torch::Tensor forward(torch::Tensor x) {
    const int64_t B = x.size(0), T = x.size(1);
    auto parts = call(qkv, x).chunk(3, -1);  // B x T x (heads x kHeadDim), each
    const int64_t heads = parts[0].size(-1) / kHeadDim;
    auto split = [&](const torch::Tensor& t) {
      return t.view({B, T, heads, kHeadDim}).transpose(1, 2);
    };
    torch::Tensor q = split(parts[0]), k = split(parts[1]), v = split(parts[2]);
    torch::Tensor scores = q.matmul(k.transpose(-2, -1)) / std::sqrt(double(kHeadDim));
    torch::Tensor future = torch::ones({T, T}, x.options().dtype(torch::kBool)).triu(1);
    torch::Tensor y = scores.masked_fill(future, -INFINITY).softmax(-1).matmul(v);
    return call(out, y.transpose(1, 2).reshape({B, T, heads * kHeadDim}));
  }
  nn::Linear qkv{nullptr}, out{nullptr};
};
TORCH_MODULE(Attention);

struct MlpImpl : nn::Module {
  MlpImpl() {
    up = register_module("up", nn::Linear(kWidth, 4 * kWidth));
    down = register_module("down", nn::Linear(4 * kWidth, kWidth));
  }
  torch::Tensor forward(torch::Tensor x) { return call(down, torch::gelu(call(up, x))); }
  nn::Linear up{nullptr}, down{nullptr};
};
TORCH_MODULE(Mlp);

struct BlockImpl : nn::Module {
  BlockImpl() {
    norm1 = register_module("norm1", nn::LayerNorm(nn::LayerNormOptions({kWidth})));
    attn = register_module("attn", Attention());
    norm2 = register_module("norm2", nn::LayerNorm(nn::LayerNormOptions({kWidth})));
    mlp = register_module("mlp", Mlp());
  }
  torch::Tensor forward(torch::Tensor x) {
    x = x + attn(norm1(x));
    return x + mlp(norm2(x));
  }
  nn::LayerNorm norm1{nullptr}, norm2{nullptr};
  Attention attn{nullptr};
  Mlp mlp{nullptr};
};
TORCH_MODULE(Block);

struct HeadImpl : nn::Module {
  HeadImpl() {
    norm = register_module("norm", nn::LayerNorm(nn::LayerNormOptions({kWidth})));
    logits = register_module("logits", nn::Linear(kWidth, kVocab));
  }
  torch::Tensor forward(torch::Tensor x) { return logits(norm(x)); }
  nn::LayerNorm norm{nullptr};
  nn::Linear logits{nullptr};
};
TORCH_MODULE(Head);

struct TransformerImpl : nn::Module {
  TransformerImpl() {
    embed = register_module("embed", Embed());
    blocks = register_module("blocks", nn::ModuleList());
    for (int64_t i = 0; i < kDepth; ++i)
      blocks->push_back(Block());
    head = register_module("head", Head());
  }
  torch::Tensor forward(torch::Tensor ids) {
    torch::Tensor x = call(embed, ids);
    for (size_t i = 0; i < blocks->size(); ++i) {
      auto block = blocks->ptr<BlockImpl>(i);
      x = call(block, x);
    }
    return call(head, x);
  }
  Embed embed{nullptr};
  nn::ModuleList blocks{nullptr};
  Head head{nullptr};
};
TORCH_MODULE(Transformer);

// ---- 2. What each parallelism needs to know, by module name. ----

std::shared_ptr<dtorch::models::Model> make_transformer() {
  using dtorch::models::TensorSplit;
  dtorch::models::UnitPolicy units;  // what ZeRO-3 gathers and checkpointing recomputes
  units.modules = {"blocks.*"};
  dtorch::models::TensorPlan tensor_plan = {
      // Megatron-LM's split; q, k and v are 3 column blocks of qkv.
      {"blocks.*.attn.qkv", TensorSplit::Colwise, 3},
      {"blocks.*.attn.out", TensorSplit::Rowwise},
      {"blocks.*.mlp.up", TensorSplit::Colwise},
      {"blocks.*.mlp.down", TensorSplit::Rowwise},
  };
  // The modules forward runs one after another: where a pipeline may cut it.
  std::vector<std::string> pipeline_units = {"embed", "blocks.*", "head"};
  return dtorch::models::wrap_module(Transformer(), units, tensor_plan, pipeline_units);
}

// What ZeRO-3 leaves a rank between steps: 1/dp of each unit (each block, and the rest
// together), rounded up, of the parameters this rank's tensor-parallel slice holds.
int64_t zero3_bytes(dtorch::models::Model& model, int64_t dp) {
  std::map<std::string, int64_t> units;  // "" holds the parameters outside blocks
  for (const auto& kv : model.named_parameters()) {
    std::string unit;
    for (const auto& b : model.block_names())
      if (kv.key().rfind(b + ".", 0) == 0) unit = b;
    units[unit] += kv.value().numel();
  }
  int64_t bytes = 0;
  for (const auto& u : units)
    bytes += (u.second + dp - 1) / dp * 4;
  return bytes;
}

int main(int argc, char** argv) try {
  // ---- 3. The layout, from the command line. ----
  dtorch::train::ParallelizeSpec spec;
  spec.model = "your-transformer";
  int steps = 8;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&] {
      const std::string given = i + 1 < argc ? argv[++i] : "";
      if (given.empty() || given.find_first_not_of("0123456789") != std::string::npos)
        throw dtorch::ConfigError(flag + " takes a whole number, not '" + given + "'");
      return std::stoi(given);
    };
    if (flag == "--tp") {
      spec.parallelism.tp = value();
    } else if (flag == "--pp") {
      spec.parallelism.pp = value();
    } else if (flag == "--zero3") {
      spec.strategy.kind = dtorch::train::StrategyKind::Zero3;
    } else if (flag == "--ac") {
      spec.parallelism.activation_checkpointing = 1;
    } else if (flag == "--steps") {
      steps = value();
    } else {
      throw dtorch::ConfigError("unknown flag " + flag +
                                ": use --tp N, --pp N, --zero3, --ac, --steps N");
    }
  }
  spec.parallelism.microbatches = spec.parallelism.pp > 1 ? 2 : 0;
  spec.strategy.optimizer.kind = dtorch::train::OptimizerKind::AdamW;
  spec.strategy.optimizer.lr = 3e-3;

  // ---- 4. Join the job and spread the model over it. ----
  dtorch::models::register_model("your-transformer", make_transformer);
  auto world = dtorch::comm::Communicator::from_env();
  torch::manual_seed(0);  // the same weights whatever the layout
  dtorch::train::Parallelized run = dtorch::train::parallelize(spec, world);
  const dtorch::train::Layout& layout = run.layout;

  // ---- 5. Train: every rank draws the same global batch and takes its data-parallel share.
  // The task: count on from a random start, modulo the vocabulary. ----
  const int64_t global_batch = 8, rows = global_batch / layout.data_ranks();
  for (int step = 1; step <= steps; ++step) {
    torch::manual_seed(1000 + step);
    torch::Tensor start = torch::randint(0, kVocab, {global_batch, 1}, torch::kLong);
    torch::Tensor seq = (start + torch::arange(kContext + 1)) % kVocab;
    torch::Tensor x = seq.narrow(1, 0, kContext), y = seq.narrow(1, 1, kContext);
    x = x.narrow(0, layout.data_rank() * rows, rows);
    y = y.narrow(0, layout.data_rank() * rows, rows);
    torch::Tensor loss = dtorch::train::step(run, x, y).to(torch::kDouble).reshape({1});
    layout.dp->allreduce(loss, dtorch::comm::ReduceOp::Avg, "loss");  // the whole batch's
    if (world->rank() == 0) std::printf("step %d loss %.6f\n", step, loss.item<double>());
  }

  // ---- 6. What each rank holds. ----
  const int64_t held = run.strategy->memory().param_bytes;
  std::printf("rank %d: %s, parameter bytes %lld", world->rank(), run.strategy->describe().c_str(),
              static_cast<long long>(held));
  if (spec.strategy.kind == dtorch::train::StrategyKind::Zero3)
    std::printf(" (ZeRO-3's 1/%d of each unit: %lld)", layout.dp->size(),
                static_cast<long long>(zero3_bytes(*run.model, layout.dp->size())));
  std::printf("\n");
  return 0;
} catch (const dtorch::ConfigError& e) {  // a layout that does not fit: what to change
  std::cerr << "your_transformer: " << dtorch::without_locations(e.what()) << std::endl;
  return 2;
} catch (const std::exception& e) {
  std::cerr << "your_transformer: " << e.what() << std::endl;
  return 1;
}
