// The multi-tensor optimizers (optim/fused.h) against torch::optim's per-parameter loop in
// float64, against PyTorch's own torch.optim step by step, and resuming torch::optim's
// checkpoints.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <map>

#include "dtorch/checkpoint/checkpoint.h"
#include "dtorch/optim/fused.h"
#include "models/interop.h"
#include "models/python_peer.h"
#include "support/workers.h"

namespace dtorch {
namespace {

constexpr int kSteps = 10;

// Parameters of a few shapes (a matrix, a vector, a scalar, one left without a gradient) and
// a gradient for each at each step, from a fixed seed.
struct Problem {
  std::vector<torch::Tensor> params;
  std::vector<std::vector<torch::Tensor>> grads;  // [step][param]
};

Problem make_problem(at::ScalarType dtype) {
  torch::manual_seed(7);
  Problem p;
  for (auto shape : std::vector<std::vector<int64_t>>{{6, 5}, {5}, {1}, {3, 2}})
    p.params.push_back(torch::randn(shape, torch::dtype(dtype)).set_requires_grad(true));
  for (int s = 0; s < kSteps; ++s) {
    std::vector<torch::Tensor> g;
    for (const auto& q : p.params)
      g.push_back(torch::randn(q.sizes(), torch::dtype(dtype)));
    p.grads.push_back(g);
  }
  return p;
}

std::vector<torch::Tensor> copies(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (const auto& q : params)
    out.push_back(q.detach().clone().set_requires_grad(true));
  return out;
}

// The learning rate of step s: a schedule's changing value.
double lr_at(double lr, int s) {
  return lr * (1.0 - 0.05 * s);
}

// Steps `opt` over `params` with the problem's gradients (the last parameter never gets one)
// and returns the parameters after each step.
std::vector<std::vector<torch::Tensor>> run(torch::optim::Optimizer& opt,
                                            std::vector<torch::Tensor>& params, const Problem& p,
                                            double lr, int from = 0, int to = kSteps) {
  std::vector<std::vector<torch::Tensor>> out;
  for (int s = from; s < to; ++s) {
    for (auto& group : opt.param_groups())
      group.options().set_lr(lr_at(lr, s));
    for (size_t i = 0; i + 1 < params.size(); ++i)
      params[i].mutable_grad() = p.grads[s][i].clone();
    opt.step();
    std::vector<torch::Tensor> now;
    for (const auto& q : params)
      now.push_back(q.detach().clone());
    out.push_back(now);
  }
  return out;
}

// A gradient an fp16 overflow left: its values with one of them infinite.
torch::Tensor p_inf(const torch::Tensor& g) {
  torch::Tensor out = g.clone();
  out.view({-1})[0] = std::numeric_limits<float>::infinity();
  return out;
}

struct Case {
  std::string name;
  std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>, bool fused)>
      make;
  double lr;
};

template <typename Fused, typename Plain, typename Options>
std::unique_ptr<torch::optim::Optimizer> either(std::vector<torch::Tensor> params, bool fused,
                                                const Options& o) {
  if (fused) return std::make_unique<Fused>(params, o);
  return std::make_unique<Plain>(params, o);
}

std::vector<Case> cases() {
  using namespace torch::optim;
  auto adamw = [](double wd) {
    return [wd](std::vector<torch::Tensor> p, bool f) {
      return either<optim::FusedAdamW, AdamW>(
          p, f, AdamWOptions(1e-2).betas({0.9, 0.95}).eps(1e-8).weight_decay(wd));
    };
  };
  auto adam = [](double wd) {
    return [wd](std::vector<torch::Tensor> p, bool f) {
      return either<optim::FusedAdam, Adam>(
          p, f, AdamOptions(1e-2).betas({0.8, 0.99}).eps(1e-6).weight_decay(wd));
    };
  };
  auto sgd = [](double momentum, double dampening, bool nesterov, double wd) {
    return [=](std::vector<torch::Tensor> p, bool f) {
      return either<optim::FusedSGD, SGD>(
          p, f,
          SGDOptions(0.1).momentum(momentum).dampening(dampening).nesterov(nesterov).weight_decay(
              wd));
    };
  };
  return {{"adamw", adamw(0.01), 1e-2},
          {"adamw-no-decay", adamw(0), 1e-2},
          {"adam", adam(0), 1e-2},
          {"adam-l2", adam(0.05), 1e-2},
          {"sgd", sgd(0.9, 0, false, 0), 0.1},
          {"sgd-nesterov-decay", sgd(0.9, 0, true, 1e-3), 0.1},
          {"sgd-dampening", sgd(0.5, 0.3, false, 0), 0.1},
          {"sgd-plain", sgd(0, 0, false, 0.01), 0.1}};
}

// In float64 the multi-tensor step and torch::optim's loop differ only by rounding.
TEST(FusedOptimizer, MatchesTorchOptimsLoopInFloat64) {
  const Problem problem = make_problem(torch::kFloat64);
  for (const Case& c : cases()) {
    auto mine = copies(problem.params), theirs = copies(problem.params);
    auto fused = c.make(mine, true), plain = c.make(theirs, false);
    auto got = run(*fused, mine, problem, c.lr), want = run(*plain, theirs, problem, c.lr);
    for (int s = 0; s < kSteps; ++s) {
      for (size_t i = 0; i < mine.size(); ++i) {
        EXPECT_TRUE(torch::allclose(got[s][i], want[s][i], 1e-12, 1e-12))
            << c.name << " step " << s << " parameter " << i << ": max difference "
            << (got[s][i] - want[s][i]).abs().max().item<double>();
      }
    }
    // The parameter without a gradient is untouched, as in the loop.
    EXPECT_TRUE(torch::equal(got.back().back(), problem.params.back().detach())) << c.name;
    // The state is torch::optim's: as many entries, and the loop's step counts.
    EXPECT_EQ(fused->state().size(), plain->state().size()) << c.name;
  }
}

// A step the device skips (an fp16 overflow's flag) leaves parameters and moments as they
// are, and once the host takes back what it recorded the run goes on exactly as a run that
// never saw that step's gradients (Note [Steps the device skips]), first steps included.
TEST(FusedOptimizer, AStepTheFlagSkipsIsAsIfNeverTaken) {
  const Problem problem = make_problem(torch::kFloat32);
  const auto flag = [](float v) { return torch::full({1}, v); };
  for (const Case& c : cases()) {
    for (int skipped : {0, 4}) {
      SCOPED_TRACE(c.name + " skipping step " + std::to_string(skipped));
      auto mine = copies(problem.params), theirs = copies(problem.params);
      auto skipping = c.make(mine, true), plain = c.make(theirs, true);
      for (int s = 0; s < kSteps; ++s) {
        if (s == skipped) {
          for (size_t i = 0; i + 1 < mine.size(); ++i)
            mine[i].mutable_grad() = p_inf(problem.grads[s][i]);
          const auto before = copies(mine);
          optim::step_unless(*skipping, flag(1));
          for (size_t i = 0; i < mine.size(); ++i)
            EXPECT_TRUE(torch::equal(mine[i], before[i])) << "parameter " << i;
          optim::undo_skipped_step(*skipping);
          continue;
        }
        for (size_t i = 0; i + 1 < mine.size(); ++i) {
          mine[i].mutable_grad() = problem.grads[s][i].clone();
          theirs[i].mutable_grad() = problem.grads[s][i].clone();
        }
        optim::step_unless(*skipping, flag(0));
        plain->step();
      }
      for (size_t i = 0; i < mine.size(); ++i)
        EXPECT_TRUE(torch::equal(mine[i], theirs[i])) << "parameter " << i;
    }
  }
}

// Parameters on two dtypes in one group step in one call each, and still match the loop.
TEST(FusedOptimizer, StepsEachDtypeOfAGroupApart) {
  torch::manual_seed(3);
  auto make = [] {
    return std::vector<torch::Tensor>{torch::randn({4, 4}, torch::kFloat64).set_requires_grad(true),
                                      torch::randn({4}, torch::kFloat32).set_requires_grad(true)};
  };
  auto a = make();
  auto b = copies(a);
  optim::FusedAdamW fused(a, torch::optim::AdamWOptions(0.1));
  torch::optim::AdamW plain(b, torch::optim::AdamWOptions(0.1));
  for (int s = 0; s < 3; ++s) {
    for (size_t i = 0; i < a.size(); ++i) {
      auto g = torch::randn(a[i].sizes(), a[i].options().requires_grad(false));
      a[i].mutable_grad() = g.clone();
      b[i].mutable_grad() = g.clone();
    }
    fused.step();
    plain.step();
  }
  EXPECT_TRUE(torch::allclose(a[0], b[0], 1e-12, 1e-12));
  EXPECT_TRUE(torch::allclose(a[1], b[1], 1e-6, 1e-6));
}

// A checkpoint torch::optim's AdamW wrote (as every run before the fused optimizers did)
// resumes into the fused one, and the run goes on as if it had never stopped; and the other
// way round.
TEST(FusedOptimizer, ResumesCheckpointsOfTorchOptimAndBack) {
  const Problem problem = make_problem(torch::kFloat32);
  testing::TempDir dir("fused-resume");
  torch::nn::Linear holder(1, 1);  // a checkpoint holds a model; this one is not stepped
  for (bool fused_first : {false, true}) {
    auto straight = copies(problem.params);
    auto reference = cases()[0].make(straight, false);
    auto want = run(*reference, straight, problem, 1e-2);

    auto first = copies(problem.params);
    auto before = cases()[0].make(first, fused_first);
    run(*before, first, problem, 1e-2, 0, 4);
    const std::string folder = dir.path() + (fused_first ? "/fused" : "/plain");
    checkpoint::save_checkpoint(folder, {1, 4, "{}"}, *holder, before.get());

    auto second = copies(first);
    auto after = cases()[0].make(second, !fused_first);
    checkpoint::load_checkpoint(checkpoint::checkpoint_path(folder, 1), *holder, after.get());
    auto got = run(*after, second, problem, 1e-2, 4, kSteps);
    for (size_t i = 0; i < second.size(); ++i) {
      EXPECT_TRUE(torch::allclose(got.back()[i], want.back()[i], 1e-5, 1e-6))
          << (fused_first ? "fused, then torch::optim" : "torch::optim, then fused")
          << ": parameter " << i;
    }
  }
}

// The same numbers as PyTorch's torch.optim, step by step: AdamW(fused=True), Adam(fused=True)
// and SGD(fused=True) where this LibTorch has the fused kernels (2.4 and later), the
// foreach=True path otherwise; the learning rate changes every step, as under a schedule.
// Tolerance: 1e-6 relative and absolute in float32 (the same kernels give equal bits).
TEST(FusedOptimizer, MatchesPyTorchStepByStep) {
  DTORCH_SKIP_WITHOUT_PYTHON(/*need_peer=*/false);
  const Problem problem = make_problem(torch::kFloat32);
  const std::string dir = testing::scratch_dir("fused-python");
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (size_t i = 0; i < problem.params.size(); ++i)
    tensors.emplace_back("p" + std::to_string(i), problem.params[i].detach());
  for (int s = 0; s < kSteps; ++s)
    for (size_t i = 0; i + 1 < problem.params.size(); ++i)
      tensors.emplace_back("g" + std::to_string(s) + "_" + std::to_string(i), problem.grads[s][i]);
  testing::save_tensors(dir + "/problem.pt", tensors);
  std::string out;
  int rc = testing::run_python(dir, "optimizers", R"PY(
import json, sys
kind, steps = sys.argv[2], int(sys.argv[3])
t = torch.load("problem.pt")
n = sum(1 for k in t if k.startswith("p"))
O = torch.optim
def fast(cls, **kw):
    return (lambda ps: cls(ps, fused=True, **kw)) if kind == "fused" else \
           (lambda ps: cls(ps, foreach=True, **kw))
cases = {
    "adamw": (fast(O.AdamW, lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01), 1e-2),
    "adamw-no-decay": (fast(O.AdamW, lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0), 1e-2),
    "adam": (fast(O.Adam, lr=1e-2, betas=(0.8, 0.99), eps=1e-6), 1e-2),
    "adam-l2": (fast(O.Adam, lr=1e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05), 1e-2),
    "sgd": (fast(O.SGD, lr=0.1, momentum=0.9), 0.1),
    "sgd-nesterov-decay": (fast(O.SGD, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3), 0.1),
    "sgd-dampening": (fast(O.SGD, lr=0.1, momentum=0.5, dampening=0.3), 0.1),
    "sgd-plain": (fast(O.SGD, lr=0.1, momentum=0, weight_decay=0.01), 0.1),
}
result = {}
for name, (make, lr) in cases.items():
    ps = [t["p%d" % i].clone().requires_grad_(True) for i in range(n)]
    opt = make(ps)
    trace = []
    for s in range(steps):
        opt.param_groups[0]["lr"] = lr * (1.0 - 0.05 * s)
        for i in range(n - 1):
            ps[i].grad = t["g%d_%d" % (s, i)].clone()
        opt.step()
        trace.append([p.detach().flatten().tolist() for p in ps])
    result[name] = trace
print("RESULT " + json.dumps(result))
)PY",
                               {optim::fused_kernels(), std::to_string(kSteps)}, &out);
  ASSERT_EQ(rc, 0) << out;
  auto want = testing::printed_result(out);
  ASSERT_FALSE(want.is_discarded()) << out;
  for (const Case& c : cases()) {
    auto mine = copies(problem.params);
    auto fused = c.make(mine, true);
    auto got = run(*fused, mine, problem, c.lr);
    for (int s = 0; s < kSteps; ++s) {
      for (size_t i = 0; i < mine.size(); ++i) {
        auto theirs = torch::tensor(want.at(c.name).at(s).at(i).get<std::vector<float>>());
        EXPECT_TRUE(torch::allclose(got[s][i].flatten(), theirs, 1e-6, 1e-6))
            << c.name << " step " << s << " parameter " << i << " (" << optim::fused_kernels()
            << "): max difference " << (got[s][i].flatten() - theirs).abs().max().item<float>();
      }
    }
  }
}

}  // namespace
}  // namespace dtorch
