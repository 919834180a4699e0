// Context parallelism: the chunk layout without processes, then ring attention and Ulysses in
// real processes against the unsplit attention computed in float64 on every rank (with and
// without padding), and five AdamW steps of a context-parallel GPT and ViT (alone, under ZeRO-3
// and under tensor parallelism, all assembled by train::parallelize) against one process
// training the whole batch.
#include "dtorch/parallel/cp/context_parallel.h"

#include <gtest/gtest.h>
#include <torch/optim/adamw.h>

#include <fstream>
#include <sstream>

#include "dtorch/core/error.h"
#include "dtorch/models/gpt.h"
#include "dtorch/models/module_hooks.h"
#include "dtorch/models/registry.h"
#include "dtorch/parallel/cp/attention.h"
#include "dtorch/parallel/cp/sequence_chunks.h"
#include "dtorch/train/loss.h"
#include "dtorch/train/parallelize.h"
#include "support/command.h"
#include "support/error_of.h"
#include "support/workers.h"

namespace dtorch::cp {
namespace {

using models::GPT;
using models::GPTConfig;
using testing::read_file;

TEST(SequenceChunks, EachRankHoldsAHeadAndATailAndTheyRoundTrip) {
  EXPECT_EQ(chunks_of(0, 4), (std::array<int64_t, 2>{0, 7}));
  EXPECT_EQ(chunks_of(3, 4), (std::array<int64_t, 2>{3, 4}));
  for (int n : {1, 2, 3, 4}) {
    const int64_t T = 2 * n * 3;
    torch::Tensor x = torch::arange(T).view({1, T}) * 10;
    std::vector<torch::Tensor> parts;
    for (int r = 0; r < n; ++r) {
      parts.push_back(shard_sequence(x, 1, r, n));
      ASSERT_EQ(parts.back().size(1), T / n);
      // The positions of a rank's tokens are what the tokens themselves are here.
      EXPECT_TRUE(global_positions(T / n, r, n, torch::kCPU).equal(parts.back()[0] / 10)) << n;
    }
    EXPECT_TRUE(unshard_sequence(parts, 1).equal(x)) << n;
    EXPECT_TRUE(
        torch::cat(parts, 1).index_select(1, sequence_order(T / n, n, torch::kCPU)).equal(x))
        << n;
  }
}

TEST(SequenceChunks, EveryRankAttendsToAsManyCausalPairs) {
  // Note [Load-balanced chunks]: token t attends to t + 1 keys; each rank's tokens add up alike.
  const int n = 4;
  const int64_t T = 64;
  for (int r = 0; r < n; ++r) {
    torch::Tensor pos = global_positions(T / n, r, n, torch::kCPU);
    EXPECT_EQ((pos + 1).sum().item<int64_t>(), T * (T + 1) / 2 / n) << "rank " << r;
  }
}

TEST(SequenceChunks, PaddedLengthIsTheNextMultipleOfTwiceTheRanks) {
  EXPECT_EQ(padded_length(17, 1), 18);
  EXPECT_EQ(padded_length(17, 2), 20);
  EXPECT_EQ(padded_length(17, 4), 24);
  EXPECT_EQ(padded_length(32, 4), 32);
  EXPECT_EQ(padded_length(50, 3), 54);
}

TEST(SequenceChunks, LengthThatDoesNotSplitIsNamed) {
  const std::string e = testing::error_of<ConfigError>([] {
    shard_sequence(torch::zeros({2, 30}), 1, 0, 4);
  });
  EXPECT_NE(e.find("30 tokens"), std::string::npos) << e;
  EXPECT_NE(e.find("multiple of 8"), std::string::npos) << e;
}

TEST(ContextParallel, OneRankComputesWhatTheModelDoes) {
  auto world = comm::Communicator::create(launch::RankInfo{});
  torch::manual_seed(3);
  auto ref = std::make_shared<GPT>(GPTConfig::debug());
  auto x = torch::randint(0, 256, {2, 32}, torch::kLong);
  for (Kind kind : {Kind::Ring, Kind::Ulysses}) {
    torch::manual_seed(3);
    auto gpt = std::make_shared<GPT>(GPTConfig::debug());
    auto cp = parallelize(*gpt, world, {kind});
    EXPECT_TRUE(torch::allclose(gpt->forward(cp->shard(x)), ref->forward(x), 1e-5, 1e-6))
        << name_of(kind);
    // Destroying the handle removes the hooks.
    cp.reset();
    EXPECT_EQ(models::module_hooks(*gpt->named_modules()["transformer.h.0.attn.core"]), nullptr);
    EXPECT_EQ(models::module_hooks(*gpt->named_modules()["transformer.wpe"]), nullptr);
  }
  // ViT's 17 tokens are padded to 18 even on one rank (Note [Padded sequences]).
  torch::manual_seed(4);
  auto vit_ref = models::make_model("vit-debug");
  auto images = torch::randn({3, 1, 28, 28});
  for (Kind kind : {Kind::Ring, Kind::Ulysses}) {
    torch::manual_seed(4);
    auto vit = models::make_model("vit-debug");
    auto cp = parallelize(*vit, world, {kind});
    EXPECT_TRUE(cp->shard(images).equal(images));  // its batches stay whole
    EXPECT_EQ(cp->local_length(0), 18);
    EXPECT_TRUE(torch::allclose(vit->forward(images), vit_ref->forward(images), 1e-5, 1e-6))
        << name_of(kind);
  }
  const std::string e = testing::error_of<ConfigError>(
      [&] { parallelize(*models::make_model("resnet-debug"), world, {Kind::Ring}); });
  EXPECT_NE(e.find("without --cp"), std::string::npos) << e;
}

// args: DIR. Rank r's queries, keys and values are its chunks of the same random tensors on
// every rank; its output and its input's gradient are compared with its chunks of the unsplit
// attention's, computed in float64, for both kinds, causal and not, at 32 and 1024 tokens and
// at 17, padded to a multiple of 2n with random values that must not count (Note [Padded
// sequences]; the gradient arriving at padding is zero, as when the model drops it).
DTORCH_TEST_WORKER(cp_attention) {
  auto group = comm::Communicator::from_env();
  const int n = group->size(), r = group->rank();
  std::ofstream report(args.at(0) + "/rank" + std::to_string(r));
  double worst = 0;
  for (int64_t T : {32, 1024, 17}) {
    const int64_t P = padded_length(T, n);
    for (bool causal : {true, false}) {
      torch::manual_seed(T + causal);
      torch::Tensor qkv = torch::randn({3, 2, 4, P, 8}, torch::kDouble);
      torch::Tensor dout = torch::randn({2, 4, P, 8}, torch::kDouble);
      dout.narrow(2, T, P - T).zero_();
      torch::Tensor whole = qkv.narrow(3, 0, T).clone().requires_grad_();
      torch::Tensor ref = models::attention(whole[0], whole[1], whole[2], causal,
                                            models::AttentionKernel::Explicit);
      ref.backward(dout.narrow(2, 0, T));
      // The reference padded with zeros, and this rank's real tokens.
      ref = torch::constant_pad_nd(ref.detach(), {0, 0, 0, P - T});
      const torch::Tensor grad = torch::constant_pad_nd(whole.grad(), {0, 0, 0, P - T});
      const torch::Tensor real = global_positions(P / n, r, n, torch::kCPU).lt(T);
      for (Kind kind : {Kind::Ring, Kind::Ulysses}) {
        torch::Tensor mine = shard_sequence(qkv, 3, r, n).to(torch::kFloat).requires_grad_();
        torch::Tensor out =
            kind == Kind::Ring
                ? ring_attention(mine, group, causal, T)
                : ulysses_attention(mine, group, causal, models::AttentionKernel::Explicit, T);
        out.backward(shard_sequence(dout, 2, r, n).to(torch::kFloat));
        const double d_out = (out.to(torch::kDouble) - shard_sequence(ref, 2, r, n))
                                 .index({torch::indexing::Slice(), torch::indexing::Slice(), real})
                                 .abs()
                                 .max()
                                 .item<double>();
        const double d_grad = (mine.grad().to(torch::kDouble) - shard_sequence(grad, 3, r, n))
                                  .abs()
                                  .max()
                                  .item<double>();
        report << name_of(kind) << " T " << T << (causal ? " causal" : " full") << ": output "
               << d_out << ", gradient " << d_grad << "\n";
        worst = std::max({worst, d_out, d_grad});
      }
    }
  }
  // Ulysses splits the heads: 2 heads over 4 ranks do not.
  if (n == 4) {
    report << "heads: " << testing::error_of<ConfigError>([&] {
      ulysses_attention(torch::zeros({3, 1, 2, 8, 4}), group, true,
                        models::AttentionKernel::Explicit);
    }) << "\n";
  }
  report << "worst " << worst << "\n";
  DTORCH_CHECK(worst <= 1e-5, "context-parallel attention differs from the unsplit by ", worst);
}

class ContextParallelAttention : public ::testing::TestWithParam<int> {};

TEST_P(ContextParallelAttention, OutputsAndGradientsEqualTheUnsplitAttention) {
  const int n = GetParam();
  std::string dir = testing::scratch_dir("cp_attention");
  EXPECT_EQ(testing::run_ranks(n, "cp_attention", {dir}), 0);
  for (int r = 0; r < n; ++r)
    std::cout << "rank " << r << ":\n" << read_file(dir + "/rank" + std::to_string(r));
  if (n == 4) {
    const std::string first = read_file(dir + "/rank0");
    EXPECT_NE(first.find("2 head(s) (per tensor-parallel rank) do not divide"), std::string::npos)
        << first;
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, ContextParallelAttention, ::testing::Values(2, 4),
                         [](const auto& info) { return "cp" + std::to_string(info.param); });

// args: DIR CP TP STRATEGY MODELS (gpt-debug: 32 tokens, gpt-long: 1024, vit-debug: 17 padded,
// comma-separated). For each model, ring and Ulysses where its heads divide: the job (world / (cp x
// tp) data-parallel replicas) assembled by train::parallelize trains 5 AdamW steps, each replica on
// its rows of a global batch and each cp rank on its tokens; every rank also trains the unsplit
// model alone on the whole global batch, and the parameters and losses are compared.
DTORCH_TEST_WORKER(cp_parity) {
  auto world = comm::Communicator::from_env();
  const int cp = std::stoi(args.at(1)), tp = std::stoi(args.at(2));
  std::ofstream report(args.at(0) + "/rank" + std::to_string(world->rank()));
  double worst_all = 0;
  std::istringstream models_given(args.at(4));
  for (std::string model; std::getline(models_given, model, ',');) {
    const bool vit = model.rfind("vit", 0) == 0;
    for (Kind kind : {Kind::Ring, Kind::Ulysses}) {
      if (kind == Kind::Ulysses &&
          models::make_model(model)->context_parallel_plan().heads / tp % cp != 0) {
        report << model << " ulysses: not run, the heads per rank do not divide by " << cp << "\n";
        continue;
      }
      train::ParallelizeSpec spec;
      spec.model = model;
      spec.parallelism.cp = cp;
      spec.parallelism.cp_kind = kind;
      spec.parallelism.tp = tp;
      spec.strategy.kind = *value_named<train::StrategyKind>(args.at(3));
      spec.strategy.optimizer.kind = train::OptimizerKind::AdamW;
      spec.strategy.optimizer.lr = 1e-3;
      torch::manual_seed(0);
      auto ref = models::make_model(model);
      torch::manual_seed(0);
      train::Parallelized run = train::parallelize(spec, world);
      const train::Layout& layout = run.layout;
      const tp::TensorParallel* split = layout.tp.handle.get();
      torch::optim::AdamW opt(ref->parameters(),
                              torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
      const int64_t T = model == "gpt-debug" ? 32 : 1024, B = 2;
      double worst_loss = 0;
      for (int step = 0; step < 5; ++step) {
        torch::manual_seed(100 + step);
        const int64_t rows = B * layout.data_ranks();
        torch::Tensor x =
            vit ? torch::randn({rows, 1, 28, 28}) : torch::randint(0, 256, {rows, T}, torch::kLong);
        torch::Tensor y = torch::randint(
            0, vit ? 10 : 256, vit ? std::vector<int64_t>{rows} : std::vector<int64_t>{rows, T},
            torch::kLong);
        opt.zero_grad();
        torch::Tensor l_ref = train::cross_entropy(ref->forward(x), y);
        l_ref.backward();
        opt.step();
        torch::Tensor mine_x = layout.local_tokens(x.narrow(0, layout.data_rank() * B, B));
        torch::Tensor mine_y = layout.local_tokens(y.narrow(0, layout.data_rank() * B, B));
        run.strategy->set_lr(1e-3);
        torch::Tensor l = train::cross_entropy(run.model->forward(mine_x), mine_y, split);
        run.strategy->backward(l, true);
        run.strategy->step(0);
        // The job's loss: the mean of every rank's, whose tokens are equally many.
        torch::Tensor mean = l.detach().to(torch::kDouble).reshape({1});
        world->allreduce(mean, comm::ReduceOp::Avg, "loss");
        worst_loss = std::max(worst_loss, std::abs(mean.item<double>() - l_ref.item<double>()));
      }
      auto whole = run.strategy->whole_parameters();
      torch::OrderedDict<std::string, torch::Tensor> full =
          split ? split->full_state_dict(*run.model) : run.model->named_parameters();
      double worst = 0;
      std::string where;
      for (const auto& kv : ref->named_parameters()) {
        torch::Tensor diff = (full[kv.key()] - kv.value()).abs();
        // As in the tensor-parallel parity test: the key bias's gradient is zero in exact
        // arithmetic and AdamW turns its rounding noise into steps of size lr.
        if (kv.key().find("c_attn.bias") != std::string::npos ||
            kv.key().find("in_proj_bias") != std::string::npos)
          diff = diff.view({3, -1}).index_select(0, torch::tensor({0, 2}, torch::kLong));
        const double d = diff.max().item<double>();
        if (d > worst) worst = d, where = kv.key();
      }
      report << model << " " << name_of(kind) << ": params " << worst << " at " << where
             << ", loss " << worst_loss << "\n";
      worst_all = std::max({worst_all, worst, worst_loss});
    }
  }
  report << "worst " << worst_all << "\n";
  DTORCH_CHECK(worst_all <= 1e-5, "context-parallel training differs from one process by ",
               worst_all);
}

struct ParityCase {
  int cp, tp, world;
  std::string strategy, models;
};
// What gtest (and ctest's test name) shows of a case: its words, not its bytes.
void PrintTo(const ParityCase& c, std::ostream* os) {
  *os << "cp " << c.cp << " tp " << c.tp << " of " << c.world << " ranks " << c.strategy << " "
      << c.models;
}

class ContextParallelParity : public ::testing::TestWithParam<ParityCase> {};

TEST_P(ContextParallelParity, FiveAdamWStepsMatchOneProcess) {
  const ParityCase& c = GetParam();
  std::string dir = testing::scratch_dir("cp_parity");
  EXPECT_EQ(
      testing::run_ranks(c.world, "cp_parity",
                         {dir, std::to_string(c.cp), std::to_string(c.tp), c.strategy, c.models}),
      0);
  for (int r = 0; r < c.world; ++r)
    std::cout << "rank " << r << ":\n" << read_file(dir + "/rank" + std::to_string(r));
}

INSTANTIATE_TEST_SUITE_P(Layouts, ContextParallelParity,
                         // At 1024 tokens the 4-rank layouts take most of a minute on 2 cores;
                         // gpt-long's attention at cp 4 is compared above.
                         ::testing::Values(ParityCase{2, 1, 2, "ddp",
                                                      "gpt-debug,gpt-long,vit-debug"},
                                           ParityCase{4, 1, 4, "ddp", "gpt-debug,vit-debug"},
                                           ParityCase{2, 1, 4, "zero3", "gpt-debug,vit-debug"},
                                           ParityCase{2, 2, 4, "ddp", "gpt-debug,vit-debug"}),
                         [](const auto& info) {
                           const ParityCase& c = info.param;
                           return "cp" + std::to_string(c.cp) + "_tp" + std::to_string(c.tp) +
                                  "_dp" + std::to_string(c.world / (c.cp * c.tp)) + "_" +
                                  c.strategy;
                         });

}  // namespace
}  // namespace dtorch::cp
