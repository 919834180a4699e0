// Tests for the gradient-readiness engine (Note [Gradient readiness]) in one process: the
// callbacks record what happened, and a chain of parameters makes backward produce their
// gradients last layer first.
#include "dtorch/parallel/grad_ready.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dtorch/core/error.h"

namespace dtorch::parallel {
namespace {

// loss = (((x * p0) * p1) * p2 ...).sum() + unused params: backward reaches the last
// parameter first.
struct Chain {
  explicit Chain(int used, int unused = 0) {
    for (int i = 0; i < used + unused; ++i) {
      params.push_back(torch::full({2}, 1.0 + i, torch::requires_grad()));
      names.push_back("p" + std::to_string(i));
    }
    this->used = used;
  }
  torch::Tensor loss() const {
    torch::Tensor y = torch::ones({2});
    for (int i = 0; i < used; ++i)
      y = y * params[i];
    return y.sum();
  }
  std::vector<torch::Tensor> params;
  std::vector<std::string> names;
  int used = 0;
};

struct Recorder {
  std::vector<std::string> events;
  GradReadiness::Callbacks callbacks() {
    return {[this](size_t i) { events.push_back("absorb " + std::to_string(i)); },
            [this](size_t g) { events.push_back("launch " + std::to_string(g)); },
            [this](size_t n) { events.push_back("wait " + std::to_string(n)); },
            [this] { events.push_back("complete"); }};
  }
};

GradReadiness::Policy policy(bool fill_unused = false) {
  return {"Test", fill_unused, "pass the flag", "run one backward"};
}

using Events = std::vector<std::string>;

TEST(GradReady, LaunchesInTheGivenOrderNotTheOrderGroupsComplete) {
  Chain c(3);
  Recorder r;
  GradReadiness ready(c.params, c.names, {0, 1, 2}, {0, 1, 2}, policy(), r.callbacks());
  c.loss().backward();
  // Group 0 completes last, and groups 1 and 2 wait for it.
  EXPECT_EQ(r.events, (Events{"absorb 2", "absorb 1", "absorb 0", "launch 0", "launch 1",
                              "launch 2", "wait 3", "complete"}));
  EXPECT_FALSE(ready.in_backward());
}

TEST(GradReady, LaunchesEachGroupAsSoonAsItAndItsPredecessorsAreComplete) {
  Chain c(4);
  Recorder r;
  // Groups: {p0, p1} and {p2, p3}; backward completes group 1 first.
  GradReadiness ready(c.params, c.names, {0, 0, 1, 1}, {1, 0}, policy(), r.callbacks());
  c.loss().backward();
  EXPECT_EQ(r.events, (Events{"absorb 3", "absorb 2", "launch 1", "absorb 1", "absorb 0",
                              "launch 0", "wait 2", "complete"}));
  r.events.clear();
  c.loss().backward();  // every step starts over
  EXPECT_EQ(r.events.size(), 8u);
  EXPECT_EQ(r.events.back(), "complete");
}

TEST(GradReady, UnusedParametersAreAbsorbedAtTheEndWhenAllowed) {
  Chain c(2, 1);
  Recorder r;
  GradReadiness ready(c.params, c.names, {0, 1, 1}, {1, 0}, policy(true), r.callbacks());
  c.loss().backward();
  EXPECT_EQ(r.events, (Events{"absorb 1", "absorb 0", "absorb 2", "launch 1", "launch 0", "wait 2",
                              "complete"}))
      << "group 0 launches only after group 1, which waits for the unused p2";
}

TEST(GradReady, UnusedParametersAreNamedWhenNotAllowed) {
  Chain c(2, 1);
  Recorder r;
  GradReadiness ready(c.params, c.names, {0, 0, 1}, {0, 1}, policy(false), r.callbacks());
  try {
    c.loss().backward();
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("Test: parameter(s) p2 received no gradient"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("pass the flag"), std::string::npos) << e.what();
  }
  // What was launched was waited for; nothing was completed.
  EXPECT_EQ(r.events.back(), "wait 1");
}

TEST(GradReady, WithoutSyncNothingRunsAndReduceAccumulatedRunsOneStep) {
  Chain c(2);
  Recorder r;
  GradReadiness ready(c.params, c.names, {0, 1}, {1, 0}, policy(), r.callbacks());
  ready.set_sync(false);
  c.loss().backward();
  c.loss().backward();
  EXPECT_TRUE(r.events.empty());
  EXPECT_TRUE(torch::equal(c.params[0].grad(), 2 * c.params[1].detach()));  // accumulated
  EXPECT_THROW(ready.reduce_accumulated(), Error) << "inside no_sync";
  ready.set_sync(true);
  ready.reduce_accumulated();
  EXPECT_EQ(r.events,
            (Events{"absorb 0", "absorb 1", "launch 1", "launch 0", "wait 2", "complete"}));
}

// A node whose backward reports p0 ready, as a second backward through p0 (a reentrant
// checkpoint replayed twice, say) would.
struct ReportsReady : public torch::autograd::Function<ReportsReady> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x,
                               int64_t ready) {
    ctx->saved_data["ready"] = ready;
    return x.view_as(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    reinterpret_cast<GradReadiness*>(ctx->saved_data["ready"].toInt())->on_grad_ready(0);
    return {grads[0], torch::Tensor()};
  }
};

TEST(GradReady, AGradientArrivingTwiceIsAnError) {
  Chain c(2);
  Recorder r;
  GradReadiness ready(c.params, c.names, {0, 1}, {0, 1}, policy(), r.callbacks());
  auto twice = ReportsReady::apply(c.params[0] * 3, reinterpret_cast<int64_t>(&ready));
  try {
    (c.loss() + twice.sum()).backward();
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("parameter p0 got its gradient twice"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("run one backward"), std::string::npos) << e.what();
  }
}

TEST(GradReady, DestructionRemovesTheHooks) {
  Chain c(2);
  Recorder r;
  { GradReadiness ready(c.params, c.names, {0, 1}, {0, 1}, policy(), r.callbacks()); }
  c.loss().backward();
  EXPECT_TRUE(r.events.empty());
  EXPECT_TRUE(c.params[0].grad().defined());
}

TEST(GradReady, GroupsMustAllBeInTheLaunchOrder) {
  Chain c(2);
  Recorder r;
  EXPECT_THROW(GradReadiness(c.params, c.names, {0, 2}, {0, 1}, policy(), r.callbacks()), Error);
}

}  // namespace
}  // namespace dtorch::parallel
