// The optimizer's state on disk (Note [Optimizer state on disk]), without processes: flat
// parameters stepped through OptimizerOffload end exactly where the same optimizer in memory
// ends, for AdamW (with amsgrad: three state tensors), Adam and SGD with momentum, through as few
// buffers as a step needs and through many; between steps no state is in memory and no file is
// left in the folder; what it needs and lacks is named.
#include <gtest/gtest.h>

#include <sys/statvfs.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dtorch/core/paths.h"
#include "dtorch/core/storage.h"
#include "dtorch/core/torch_compat.h"
#include "dtorch/optim/fused.h"
#include "dtorch/parallel/optimizer_state.h"
#include "dtorch/parallel/zero/offload.h"
#include "models/interop.h"
#include "support/error_of.h"

namespace dtorch::zero {
namespace {

// Shards of sizes that fill a 4 KiB slot exactly, leave it partly empty and fit many in one.
std::vector<torch::Tensor> flat_params() {
  torch::manual_seed(3);
  std::vector<torch::Tensor> ps;
  for (int64_t n : {1024, 1500, 7, 9000})
    ps.push_back(torch::randn({n}));
  return ps;
}

using Factory = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)>;

// Steps an optimizer in memory and another through the disk on the same gradients (one shard
// without a gradient in step 2), and compares parameters and state bit for bit.
// Pieces of `buffer_bytes` (Note [Optimizer state on disk]): 4096 steps the shards above in 1, 2,
// 1 and 9 pieces, the last ones partial.
void expect_same_steps(const Factory& make, int buffers, size_t buffer_bytes = size_t{1} << 20) {
  testing::TempDir dir("offload_steps");
  std::vector<torch::Tensor> a = flat_params(), b = flat_params();
  auto in_memory = make(a), on_disk = make(b);
  OptimizerOffload offload(*on_disk, b, {dir.path(), buffers, "state.swap", buffer_bytes});
  // At most the largest slot: 9000 floats in whole pages.
  EXPECT_EQ(offload.buffer_bytes(), std::min<int64_t>(static_cast<int64_t>(buffer_bytes), 36864));
  EXPECT_TRUE(paths::list_directory(dir.path()).empty()) << "the file is unlinked at once";
  for (int step = 0; step < 4; ++step) {
    for (size_t k = 0; k < a.size(); ++k) {
      torch::Tensor g = step == 2 && k == 1 ? torch::Tensor() : torch::randn_like(a[k]);
      a[k].mutable_grad() = g;
      b[k].mutable_grad() = g.defined() ? g.clone() : g;
    }
    in_memory->step();
    offload.step();
    EXPECT_EQ(offload.swapped_bytes(), parallel::state_bytes(*in_memory)) << "step " << step;
    for (size_t k = 0; k < a.size(); ++k) {
      EXPECT_TRUE(a[k].equal(b[k])) << "shard " << k << " after step " << step;
      EXPECT_TRUE(b[k].grad().defined() == a[k].grad().defined()) << "its gradient is back";
    }
  }
  offload.page_in_all();
  EXPECT_EQ(offload.swapped_bytes(), 0);
  for (size_t k = 0; k < a.size(); ++k) {
    const auto& want = in_memory->state().at(compat::optimizer_state_key(a[k]));
    const auto& got = on_disk->state().at(compat::optimizer_state_key(b[k]));
    auto w = parallel::state_tensors(*want), g = parallel::state_tensors(*got);
    ASSERT_EQ(w.size(), g.size());
    for (size_t i = 0; i < w.size(); ++i)
      EXPECT_TRUE(w[i].second.equal(g[i].second)) << "shard " << k << " " << w[i].first;
    EXPECT_EQ(parallel::steps_of(*want), parallel::steps_of(*got));
  }
  // Paged in (mapped from the file), the state takes what a checkpoint's load writes into it,
  // steps on and goes out again.
  for (size_t k = 0; k < a.size(); ++k) {
    auto w = parallel::state_tensors(*in_memory->state().at(compat::optimizer_state_key(a[k])));
    auto g = parallel::state_tensors(*on_disk->state().at(compat::optimizer_state_key(b[k])));
    for (size_t i = 0; i < w.size(); ++i) {
      w[i].second.mul_(0.5);
      g[i].second.mul_(0.5);
    }
  }
  for (size_t k = 0; k < a.size(); ++k) {
    a[k].mutable_grad() = torch::ones_like(a[k]);
    b[k].mutable_grad() = torch::ones_like(b[k]);
  }
  in_memory->step();
  offload.step();
  for (size_t k = 0; k < a.size(); ++k)
    EXPECT_TRUE(a[k].equal(b[k])) << "shard " << k << " after paging in";
  EXPECT_EQ(offload.swapped_bytes(), parallel::state_bytes(*in_memory));
}

TEST(OptimizerOffload, AdamWStepsAsInMemoryThroughTheFewestBuffersAndMany) {
  auto adamw = [](std::vector<torch::Tensor> p) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<optim::FusedAdamW>(p, torch::optim::AdamWOptions(1e-2));
  };
  expect_same_steps(adamw, 2);
  expect_same_steps(adamw, 16);
  expect_same_steps(adamw, 2, 4096);
  expect_same_steps(adamw, 5, 4096);
}

TEST(OptimizerOffload, AmsgradAdamAndSgdStepAsInMemory) {
  expect_same_steps(
      [](std::vector<torch::Tensor> p) -> std::unique_ptr<torch::optim::Optimizer> {
        return std::make_unique<optim::FusedAdamW>(p,
                                                   torch::optim::AdamWOptions(1e-2).amsgrad(true));
      },
      3, 4096);
  expect_same_steps(
      [](std::vector<torch::Tensor> p) -> std::unique_ptr<torch::optim::Optimizer> {
        return std::make_unique<optim::FusedAdam>(p, torch::optim::AdamOptions(1e-2));
      },
      4, 8192);
  expect_same_steps(
      [](std::vector<torch::Tensor> p) -> std::unique_ptr<torch::optim::Optimizer> {
        return std::make_unique<torch::optim::SGD>(
            p, torch::optim::SGDOptions(0.1).momentum(0.9).dampening(0.5));
      },
      1, 4096);
}

// A step the device skips (fp16's overflow) changes nothing, and leaves nothing to take back.
TEST(OptimizerOffload, ASkippedStepChangesNothing) {
  testing::TempDir dir("offload_skip");
  std::vector<torch::Tensor> p = flat_params();
  optim::FusedAdamW opt(p, torch::optim::AdamWOptions(1e-2));
  OptimizerOffload offload(opt, p, {dir.path(), 2, "state.swap"});
  for (auto& t : p)
    t.mutable_grad() = torch::ones_like(t);
  offload.step();
  std::vector<torch::Tensor> before;
  for (auto& t : p)
    before.push_back(t.clone());
  offload.step(torch::ones({1}));
  optim::undo_skipped_step(opt);
  offload.page_in_all();
  for (size_t k = 0; k < p.size(); ++k) {
    EXPECT_TRUE(p[k].equal(before[k])) << "shard " << k;
    EXPECT_EQ(parallel::steps_of(*opt.state().at(compat::optimizer_state_key(p[k]))), 1);
  }
}

// A resume: state made on disk before any step (init_state) reads as the optimizer's fresh
// state, takes a checkpoint's values through the mapping, and steps as the optimizer that
// wrote them.
TEST(OptimizerOffload, AResumeLoadsIntoStateMadeOnDisk) {
  testing::TempDir dir("offload_resume");
  std::vector<torch::Tensor> a = flat_params(), b = flat_params();
  optim::FusedAdamW saved(a, torch::optim::AdamWOptions(1e-2));
  for (int step = 0; step < 2; ++step) {
    for (auto& t : a)
      t.mutable_grad() = torch::randn_like(t);
    saved.step();
  }
  for (size_t k = 0; k < a.size(); ++k)
    b[k].copy_(a[k]);
  optim::FusedAdamW resumed(b, torch::optim::AdamWOptions(1e-2));
  OptimizerOffload offload(resumed, b, {dir.path(), 2, "state.swap", 4096});
  offload.init_state();
  int64_t bytes = 0;
  for (const auto& t : b)
    bytes += 2 * t.nbytes();
  EXPECT_EQ(offload.swapped_bytes(), bytes) << "made on disk, not in memory";
  offload.page_in_all();
  for (size_t k = 0; k < a.size(); ++k) {
    auto& st = *resumed.state().at(compat::optimizer_state_key(b[k]));
    auto w = parallel::state_tensors(*saved.state().at(compat::optimizer_state_key(a[k])));
    auto g = parallel::state_tensors(st);
    ASSERT_EQ(w.size(), g.size());
    for (size_t i = 0; i < w.size(); ++i) {
      EXPECT_TRUE(g[i].second.equal(torch::zeros_like(g[i].second))) << "fresh: zeros";
      g[i].second.copy_(w[i].second);
    }
    parallel::set_steps(st, 2);
  }
  for (int step = 0; step < 2; ++step) {
    for (size_t k = 0; k < a.size(); ++k) {
      a[k].mutable_grad() = torch::randn_like(a[k]);
      b[k].mutable_grad() = a[k].grad().clone();
    }
    saved.step();
    offload.step();
    EXPECT_EQ(offload.swapped_bytes(), bytes);
    for (size_t k = 0; k < a.size(); ++k)
      EXPECT_TRUE(a[k].equal(b[k])) << "shard " << k << " after step " << step;
  }
}

// A save in the background reads a copy of the state on disk: what it holds when taken, through
// the next steps, in the slices a checkpoint cuts; nothing for a tensor not on disk; and no file
// left in the folder.
TEST(OptimizerOffload, ASnapshotOnDiskKeepsTheStateAsTaken) {
  testing::TempDir dir("offload_snapshot");
  std::vector<torch::Tensor> p = flat_params();
  optim::FusedAdamW opt(p, torch::optim::AdamWOptions(1e-2));
  OptimizerOffload offload(opt, p, {dir.path(), 2, "state.swap", 4096});
  const auto step = [&] {
    for (auto& t : p)
      t.mutable_grad() = torch::randn_like(t);
    offload.step();
  };
  step();
  offload.page_in_all();
  std::vector<torch::Tensor> slices, then;
  for (const auto& t : p)
    for (auto& [name, s] :
         parallel::state_tensors(*opt.state().at(compat::optimizer_state_key(t)))) {
      slices.push_back(s.narrow(0, 3, 4));  // a rank's piece, as checkpoint_slices cuts it
      then.push_back(slices.back().clone());
    }
  const auto snapshot = offload.snapshot();
  std::vector<torch::Tensor> copies;
  for (const auto& s : slices)
    copies.push_back(snapshot(s));
  EXPECT_FALSE(snapshot(torch::ones({4})).defined()) << "not the file's";
  step();
  step();
  offload.page_in_all();
  for (size_t i = 0; i < copies.size(); ++i) {
    ASSERT_TRUE(copies[i].defined()) << i;
    EXPECT_TRUE(copies[i].equal(then[i])) << "state " << i << " moved with the steps";
    EXPECT_FALSE(slices[i].equal(then[i])) << "state " << i << " did not step";
  }
  EXPECT_EQ(paths::list_directory(dir.path()), std::vector<std::string>{});
}

TEST(OptimizerOffload, WhatItNeedsAndLacksIsNamed) {
  testing::TempDir dir("offload_errors");
  std::vector<torch::Tensor> p = flat_params();
  optim::FusedAdamW opt(p, torch::optim::AdamWOptions(1e-2));
  std::string e = testing::error_of([&] {
    OptimizerOffload o(opt, p, {dir.path() + "/absent", 4, "state.swap"});
  });
  EXPECT_NE(e.find("the offload folder " + dir.path() + "/absent does not exist"),
            std::string::npos)
      << e;
  e = testing::error_of([&] { OptimizerOffload o(opt, p, {dir.path(), 1, "state.swap"}); });
  EXPECT_NE(e.find("--offload-buffers 1 is too few"), std::string::npos) << e;
  EXPECT_NE(e.find("give at least 2"), std::string::npos) << e;
  // 2^40 floats (held by one element): 8 TiB of state that no test machine's disk holds. Asked
  // for, ext4 and XFS would fill the disk until the file closed, failing every other writer
  // there meanwhile; the disk keeps at least half of what was free throughout.
  std::vector<torch::Tensor> huge{torch::zeros({1}).expand({int64_t{1} << 40})};
  optim::FusedAdamW big(huge, torch::optim::AdamWOptions(1e-2));
  auto free_bytes = [&] {
    struct statvfs fs {};
    return ::statvfs(dir.path().c_str(), &fs) == 0 ? uint64_t{fs.f_bavail} * fs.f_frsize : 0;
  };
  const uint64_t free_before = free_bytes();
  std::atomic<bool> done{false};
  std::atomic<uint64_t> least{free_before};
  std::thread watch([&] {
    while (!done)
      least = std::min<uint64_t>(least, free_bytes());
  });
  e = testing::error_of([&] { OptimizerOffload o(big, huge, {dir.path(), 4, "state.swap"}); });
  done = true;
  watch.join();
  EXPECT_NE(e.find("8796093022208"), std::string::npos) << "the bytes it needs: " << e;
  EXPECT_GE(least.load(), free_before / 2) << "the disk filled while the file was refused";
  EXPECT_TRUE(paths::list_directory(dir.path()).empty()) << "nothing left behind";
}

}  // namespace
}  // namespace dtorch::zero
