// Evaluation (evaluate.h).
#include "dtorch/train/evaluate.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "dtorch/data/sampler.h"
#include "dtorch/parallel/autocast.h"
#include "dtorch/train/loss.h"

namespace dtorch::train {

std::pair<double, double> evaluate(models::Model& model, const Split& test, int64_t limit,
                                   Strategy& strategy, const Layout& layout,
                                   comm::Communicator& world) {
  const tp::TensorParallel* tp = layout.tp.handle.get();
  pp::Pipeline* pipeline = layout.pp.pipeline.get();
  torch::NoGradGuard no_grad;
  model.eval();
  int64_t n = limit > 0 ? std::min(limit, test.size) : test.size;
  auto shard = data::eval_shard(n, layout.data_rank(), layout.data_ranks());
  auto sums = torch::zeros({3}, torch::kDouble);  // loss, correct, count (in host memory)
  const int64_t step = model.takes_tokens() ? 16 : 1000;
  // Every rank runs as many forwards as the rank with the most batches: ZeRO-3 gathers each
  // unit in every forward, a collective, so a rank with a batch fewer runs one more on its
  // first samples and counts nothing of it. (Holding every unit gathered instead would hold
  // the whole model on every rank: gpt-xl's 6.2 GB.) A pipeline cuts each batch into as many
  // micro-batches as it has samples, up to --microbatches, and gathers per micro-batch under
  // --reshard-after-microbatch: there the stage's units stay gathered instead.
  auto whole = pipeline ? strategy.whole_parameters() : nullptr;
  auto batches = [&](int64_t samples) { return (samples + step - 1) / step; };
  int64_t most = batches(shard.size());
  for (int r = 0; r < layout.data_ranks() && !pipeline; ++r)
    most = std::max(most, batches(data::eval_shard(n, r, layout.data_ranks()).size()));
  for (int64_t i = 0; i < most; ++i) {
    const int64_t b = shard.begin + i * step;
    const bool counted = b < shard.end;
    const int64_t from = counted ? b : 0,
                  to = counted ? std::min(shard.end, b + step) : std::min<int64_t>(n, step);
    std::vector<int64_t> idx(to - from);
    std::iota(idx.begin(), idx.end(), from);
    auto [x, y] = test.batch(idx, 0);
    x = layout.local_tokens(x.to(strategy.device()));
    y = layout.local_tokens(y.to(strategy.device()));
    if (pipeline) {
      parallel::Autocast autocast(strategy.autocast());
      pipeline->forward_only(x, y, [&](const torch::Tensor& out, const torch::Tensor& t) {
        double loss = 0, correct = 0;
        if (tp && tp->vocab_parallel_output()) {  // collective over tp: every tp rank runs it
          loss = tp->vocab_cross_entropy(out, t).item<double>() * static_cast<double>(t.numel());
          correct = static_cast<double>(tp->vocab_correct(out, t));
        } else {
          loss = cross_entropy(out, t, at::Reduction::Sum).item<double>();
          correct = out.argmax(-1).eq(t).sum().item<double>();
        }
        if (!counted || (tp && tp->group()->rank() != 0)) return;  // one tp rank counts
        sums[0] += loss;
        sums[1] += correct;
        sums[2] += static_cast<double>(t.numel());
      });
      continue;
    }
    torch::Tensor out;
    {
      parallel::Autocast autocast(strategy.autocast());
      out = model.forward(x);
    }
    if (!counted) continue;
    if (tp && tp->vocab_parallel_output()) {
      sums[0] += tp->vocab_cross_entropy(out, y).item<double>() * static_cast<double>(y.numel());
      sums[1] += static_cast<double>(tp->vocab_correct(out, y));
    } else {
      sums[0] += cross_entropy(out, y, at::Reduction::Sum).item<double>();
      sums[1] += out.argmax(-1).eq(y).sum().item<double>();
    }
    sums[2] += static_cast<double>(y.numel());
  }
  (pipeline ? world : *layout.dp).allreduce(sums, comm::ReduceOp::Sum, "evaluation totals");
  model.train();
  double count = std::max(1.0, sums[2].item<double>());
  return {sums[0].item<double>() / count, sums[1].item<double>() / count};
}

}  // namespace dtorch::train
