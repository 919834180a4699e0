// Strategies and sharded checkpoints together: a ZeRO checkpoint saved at 4 ranks resumes at
// 2 ranks and at 1 with identical full parameters and optimizer state, for every stage, and
// as zero3 with other units (Note [Resharding by name]); DDP's ranks share a save and write
// what one file holds (Note [Saving replicated state]); checkpoints written in the background
// hold what blocking ones hold, and a kill during one leaves a checkpoint to resume from; and
// bf16 mixed precision follows the fp32 loss curve.
#include "dtorch/train/strategy/strategy.h"

#include <gtest/gtest.h>

#include <torch/optim/adamw.h>
#include <algorithm>
#include <csignal>
#include <fstream>
#include <map>
#include <thread>

#include "dtorch/checkpoint/sharded_checkpoint.h"
#include "dtorch/core/error.h"
#include "dtorch/core/paths.h"
#include "dtorch/core/torch_compat.h"
#include "dtorch/models/registry.h"
#include "dtorch/parallel/autocast.h"
#include "dtorch/parallel/optimizer_state.h"
#include "dtorch/train/background_save.h"
#include "dtorch/train/loss.h"
#include "support/command.h"
#include "support/workers.h"

namespace dtorch::train {
namespace {

// A strategy's name, or "ddp-sharded": ddp whose ranks share each save.
StrategyConfig adamw(const std::string& strategy) {
  StrategyConfig c;
  const bool shared = strategy == "ddp-sharded";
  c.kind = shared ? StrategyKind::DDP : *value_named<StrategyKind>(strategy);
  if (c.kind == StrategyKind::DDP)
    c.checkpoint_layout = shared ? CheckpointLayout::Sharded : CheckpointLayout::File;
  c.optimizer.kind = OptimizerKind::AdamW;
  c.optimizer.lr = 1e-3;
  c.ddp.bucket_cap_mb = 0.01;  // several units
  return c;
}

double train_steps(Strategy& s, models::Model& m, int steps, int rank, int seed_base = 0) {
  double loss_value = 0;
  for (int i = 0; i < steps; ++i) {
    torch::manual_seed(seed_base + 31 * i + rank);
    auto x = torch::randint(0, 256, {2, 16}, torch::kLong);
    auto y = torch::roll(x, 1, 1);  // learnable: predict the previous token
    torch::Tensor loss;
    {
      parallel::Autocast autocast(s.autocast());
      loss = cross_entropy(m.forward(x), y);
    }
    s.backward(loss, true);
    s.step(1.0);
    loss_value = loss.item<double>();
  }
  return loss_value;
}

// args: DIR STRATEGY MODE (save: train 3 steps and save to DIR/a; reload: load DIR/a, save
// the loaded state to DIR/b<world>; regroup: likewise as zero3 with all blocks in one unit,
// to DIR/c)
DTORCH_TEST_WORKER(zero_reshard) {
  auto comm = comm::Communicator::from_env();
  torch::manual_seed(5);
  auto model = models::make_model("gpt-debug");
  auto c = adamw(args.at(2) == "regroup" ? "zero3" : args.at(1));
  if (args.at(2) == "regroup") c.min_unit_params = int64_t{1} << 40;
  auto s = make_strategy(c, model, comm);
  if (args.at(2) == "save") {
    train_steps(*s, *model, 3, comm->rank());
    s->save(args.at(0) + "/a", {1, 3, "{}"}, 2);
  } else if (args.at(2) == "regroup") {
    auto loaded = s->load_latest(args.at(0) + "/a");
    DTORCH_CHECK(loaded && loaded->data.global_step == 3, "checkpoint not found");
    s->save(args.at(0) + "/c", {1, 3, "{}"}, 2);
  } else {
    auto loaded = s->load_latest(args.at(0) + "/a");
    DTORCH_CHECK(loaded && loaded->data.global_step == 3, "checkpoint not found");
    s->save(str(args.at(0), "/b", comm->size()), {1, 3, "{}"}, 2);
  }
}

void expect_same_checkpoint(const std::string& a, const std::string& b) {
  checkpoint::ShardedCheckpointReader ra(a), rb(b);
  ASSERT_EQ(ra.flat_tensors().size(), rb.flat_tensors().size());
  for (const auto& [key, info] : ra.flat_tensors()) {
    ASSERT_TRUE(rb.has_flat(key)) << key;
    EXPECT_TRUE(ra.read_flat(key).equal(rb.read_flat(key))) << key;
  }
  EXPECT_TRUE(ra.read_full("optim/step").equal(rb.read_full("optim/step")));
  EXPECT_GT(ra.read_full("optim/step").item<int64_t>(), 0);
}

class Reshard : public ::testing::TestWithParam<const char*> {};

TEST_P(Reshard, SavedAtFourResumesAtTwoAndOne) {
  const std::string strategy = GetParam();
  auto dir = testing::scratch_dir("reshard_" + strategy);
  ASSERT_EQ(testing::run_ranks(4, "zero_reshard", {dir, strategy, "save"}), 0);
  ASSERT_EQ(testing::run_ranks(2, "zero_reshard", {dir, strategy, "reload"}), 0);
  ASSERT_EQ(testing::run_ranks(1, "zero_reshard", {dir, strategy, "reload"}), 0);
  auto saved = checkpoint::latest_complete(dir + "/a");
  ASSERT_TRUE(saved);
  checkpoint::ShardedCheckpointReader r(*saved);
  EXPECT_EQ(r.world_size(), 4);
  EXPECT_TRUE(r.has_flat("optim/root/exp_avg") || r.has_flat("optim/bucket0/exp_avg"));
  for (int w : {2, 1}) {
    auto again = checkpoint::latest_complete(str(dir, "/b", w));
    ASSERT_TRUE(again);
    EXPECT_EQ(checkpoint::ShardedCheckpointReader(*again).world_size(), w);
    expect_same_checkpoint(*saved, *again);
  }
}

// Every parameter and per-parameter optimizer tensor of a checkpoint, by name.
std::map<std::string, torch::Tensor> by_name(const std::string& dir) {
  checkpoint::ShardedCheckpointReader r(dir);
  std::map<std::string, torch::Tensor> out;
  for (const auto& [unit, layout] : r.data().layouts) {
    for (const std::string kind : {"param/", "optim/"}) {
      for (const char* state : {"", "/exp_avg", "/exp_avg_sq"}) {
        const std::string key = kind + unit + state;
        if ((kind == "param/") != (*state == 0) || !r.has_flat(key)) continue;
        for (auto& [name, t] : checkpoint::cut_by_layout(r.read_flat(key), layout))
          out[str(name, state)] = t;
      }
    }
  }
  return out;
}

TEST_P(Reshard, ResumesAsZero3WithOtherUnits) {
  // Note [Resharding by name]: other units (and another ZeRO stage) read the same values.
  const std::string strategy = GetParam();
  auto dir = testing::scratch_dir("regroup_" + strategy);
  ASSERT_EQ(testing::run_ranks(4, "zero_reshard", {dir, strategy, "save"}), 0);
  ASSERT_EQ(testing::run_ranks(2, "zero_reshard", {dir, strategy, "regroup"}), 0);
  auto a = checkpoint::latest_complete(dir + "/a"), c = checkpoint::latest_complete(dir + "/c");
  ASSERT_TRUE(a && c);
  EXPECT_NE(checkpoint::ShardedCheckpointReader(*a).data().layouts.size(),
            checkpoint::ShardedCheckpointReader(*c).data().layouts.size());
  auto want = by_name(*a), got = by_name(*c);
  ASSERT_EQ(want.size(), got.size());
  int moments = 0;  // Adam's second moments are among what is compared
  for (const auto& kv : want)
    moments += kv.first.size() > 11 && kv.first.substr(kv.first.size() - 11) == "/exp_avg_sq";
  EXPECT_EQ(3 * moments, static_cast<int>(want.size()));
  for (const auto& [name, t] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    EXPECT_TRUE(t.equal(got[name])) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, Reshard, ::testing::Values("zero1", "zero2", "zero3"));

// args: DIR STRATEGY MODE. save: train 3 steps, save into DIR/<STRATEGY>. resume: load
// DIR/ddp-sharded and save what was loaded into DIR/resumed-<STRATEGY>-<world>. sgd: load it
// with SGD instead of AdamW, writing the error into DIR/sgd-<rank>.
DTORCH_TEST_WORKER(ddp_share) {
  const std::string dir = args.at(0), strategy = args.at(1);
  auto comm = comm::Communicator::from_env();
  torch::manual_seed(5);
  auto model = models::make_model("gpt-debug");
  StrategyConfig c = adamw(strategy);
  if (args.at(2) == "sgd") c.optimizer.kind = OptimizerKind::SGD;
  auto s = make_strategy(c, model, comm);
  if (args.at(2) == "sgd") {
    try {
      s->load_latest(dir + "/ddp-sharded");
    } catch (const CheckpointError& e) {
      std::ofstream(str(dir, "/sgd-", comm->rank())) << e.what();
    }
    return;
  }
  if (args.at(2) == "save") {
    train_steps(*s, *model, 3, comm->rank());
    s->save(dir + "/" + strategy, {1, 3, "{}"}, 2);
    return;
  }
  auto loaded = s->load_latest(dir + "/ddp-sharded");
  DTORCH_CHECK(loaded && loaded->data.global_step == 3, "checkpoint not found");
  s->save(str(dir, "/resumed-", strategy, "-", comm->size()), {1, 3, "{}"}, 2);
}

// Every parameter of a gpt-debug .dtc with AdamW, and its optimizer state ("<name>/exp_avg",
// "<name>/exp_avg_sq", "<name>/step").
std::map<std::string, torch::Tensor> dtc_by_name(const std::string& path) {
  auto model = models::make_model("gpt-debug");
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3));
  checkpoint::load_checkpoint(path, *model, &opt);
  std::map<std::string, torch::Tensor> out;
  for (const auto& p : model->named_parameters()) {
    out[p.key()] = p.value().detach();
    const auto& state = *opt.state().at(compat::optimizer_state_key(p.value()));
    for (const auto& [kind, t] : parallel::state_tensors(state))
      out[p.key() + "/" + kind] = t;
    out[p.key() + "/step"] = torch::tensor(parallel::steps_of(state));
  }
  return out;
}

// Note [Saving replicated state]: under DDP each rank writes about half of the state, and the
// shards hold exactly what rank 0's one file holds; resumed at one rank (written again as one
// file) the state is that file's, and ZeRO-1 resumes from it by name.
TEST(DdpSharedSave, EachRankWritesItsShareOfWhatOneFileHolds) {
  auto dir = testing::scratch_dir("ddp_share");
  ASSERT_EQ(testing::run_ranks(2, "ddp_share", {dir, "ddp", "save"}), 0);
  ASSERT_EQ(testing::run_ranks(2, "ddp_share", {dir, "ddp-sharded", "save"}), 0);
  const auto file = checkpoint::list_checkpoints(dir + "/ddp");
  const auto shards = checkpoint::latest_complete(dir + "/ddp-sharded");
  ASSERT_EQ(file.size(), 1u);
  ASSERT_TRUE(shards);
  EXPECT_TRUE(checkpoint::list_checkpoints(dir + "/ddp-sharded").empty());

  // Each rank wrote one share, no more than half the bytes plus the largest tensor.
  checkpoint::ShardedCheckpointReader reader(*shards);
  std::vector<int64_t> written(2, 0);
  int64_t largest = 0, total = 0;
  for (const auto& [key, info] : reader.flat_tensors()) {
    const int64_t bytes = info.numel * static_cast<int64_t>(c10::elementSize(info.dtype));
    int owners = 0;
    for (int r = 0; r < 2; ++r) {
      if (info.ranges[r].second == info.ranges[r].first) continue;
      ++owners;
      EXPECT_EQ(info.ranges[r], (std::pair<int64_t, int64_t>{0, info.numel})) << key;
      written[r] += bytes;
    }
    EXPECT_EQ(owners, 1) << key;
    largest = std::max(largest, bytes);
    total += bytes;
  }
  for (int r = 0; r < 2; ++r) {
    EXPECT_GT(written[r], 0) << "rank " << r;
    EXPECT_LE(written[r], total / 2 + largest) << "rank " << r;
  }

  // The shards hold the file's parameters, moments and step; consolidated, its model.
  const auto want = dtc_by_name(file.front());
  auto shared = by_name(*shards);
  EXPECT_EQ(shared.size() + want.size() / 4, want.size());  // all but each parameter's step
  for (const auto& [name, t] : shared) {
    ASSERT_TRUE(want.count(name)) << name;
    EXPECT_TRUE(t.equal(want.at(name))) << name;
  }
  EXPECT_EQ(reader.read_full("optim/step").item<int64_t>(), 3);
  for (const auto& [name, t] : checkpoint::consolidate_model(reader))
    EXPECT_TRUE(t.equal(want.at(name))) << name;

  // Resumed at one rank and saved as one file: the first run's file.
  ASSERT_EQ(testing::run_ranks(1, "ddp_share", {dir, "ddp", "resume"}), 0);
  const auto again = checkpoint::list_checkpoints(dir + "/resumed-ddp-1");
  ASSERT_EQ(again.size(), 1u);
  const auto got = dtc_by_name(again.front());
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, t] : want)
    EXPECT_TRUE(t.equal(got.at(name))) << name;

  // Another optimizer's state is not taken for this one's.
  ASSERT_EQ(testing::run_ranks(1, "ddp_share", {dir, "ddp", "sgd"}), 0);
  const std::string why = testing::read_file(dir + "/sgd-0");
  EXPECT_NE(why.find("holds exp_avg for"), std::string::npos) << why;
  EXPECT_NE(why.find("another optimizer"), std::string::npos) << why;

  // ZeRO-1 at two ranks reads every parameter and moment by name.
  ASSERT_EQ(testing::run_ranks(2, "ddp_share", {dir, "zero1", "resume"}), 0);
  auto zero = checkpoint::latest_complete(dir + "/resumed-zero1-2");
  ASSERT_TRUE(zero);
  auto resharded = by_name(*zero);
  EXPECT_EQ(shared.size(), resharded.size());
  for (const auto& [name, t] : shared) {
    ASSERT_TRUE(resharded.count(name)) << name;
    EXPECT_TRUE(t.equal(resharded[name])) << name;
  }
}

// Whether the step-6 save into `a` is under way or was cut short: a sharded save's staging folder
// or a .dtc's temporary file is there.
bool unpublished_save(const std::string& a) {
  if (paths::exists(checkpoint::sharded_step_dir(a, 6) + ".partial")) return true;
  for (const std::string& name : paths::list_directory(a))
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0) return true;
  return false;
}

// args: DIR STRATEGY MODE. same: train 3 steps, save them blocking into DIR/blocking and in the
// background into DIR/background while 3 more steps change every parameter. kill: save step 3
// into DIR/a, train 3 more steps and save step 6 in the background, rank 0 killing itself
// (SIGKILL) as soon as it sees the save under way (a .dtc's temporary file, a sharded save's
// staging folder) or, should it miss that, done. resume: load the newest of DIR/a and write its
// step into DIR/resumed-R.
DTORCH_TEST_WORKER(background_save) {
  const std::string dir = args.at(0), mode = args.at(2);
  auto comm = comm::Communicator::from_env();
  torch::manual_seed(5);
  auto model = models::make_model("gpt-debug");
  auto s = make_strategy(adamw(args.at(1)), model, comm);
  if (mode == "resume") {
    auto loaded = s->load_latest(dir + "/a");
    DTORCH_CHECK(loaded, "no checkpoint to resume from");
    std::ofstream(str(dir, "/resumed-", comm->rank())) << loaded->data.global_step;
    return;
  }
  train_steps(*s, *model, 3, comm->rank());
  BackgroundSaver saver(*s);
  if (mode == "same") {
    s->save(dir + "/blocking", {1, 3, "{}"}, 2);
    saver.save(dir + "/background", {1, 3, "{}"}, 2);
    for (int i = 0; i < 3; ++i) {
      train_steps(*s, *model, 1, comm->rank(), 100 + i);
      saver.poll();
    }
    saver.finish();
    return;
  }
  s->save(dir + "/a", {1, 3, "{}"}, 2);
  train_steps(*s, *model, 3, comm->rank(), 100);
  if (comm->rank() == 0) {
    std::thread([a = dir + "/a"] {
      while (!unpublished_save(a) && !paths::exists(checkpoint::sharded_step_dir(a, 6)) &&
             !paths::exists(a + "/checkpoint-000002.dtc")) {
      }
      std::raise(SIGKILL);
    }).detach();
  }
  saver.save(dir + "/a", {2, 6, "{}"}, 2);
  for (int i = 0; i < 100; ++i) {
    train_steps(*s, *model, 1, comm->rank(), 200 + i);
    saver.poll();
  }
  saver.finish();
}

// Every file under `dir` (relative name -> bytes).
std::map<std::string, std::string> files_under(const std::string& dir,
                                               const std::string& prefix = "") {
  std::map<std::string, std::string> out;
  for (const std::string& name : paths::list_directory(dir)) {
    const std::string path = paths::join(dir, name);
    if (paths::is_directory(path)) {
      for (auto& [sub, bytes] : files_under(path, prefix + name + "/"))
        out[sub] = std::move(bytes);
    } else {
      out[prefix + name] = testing::read_file(path);
    }
  }
  return out;
}

class BackgroundSave : public ::testing::TestWithParam<const char*> {};

// Note [Checkpoints in the background]: the state is copied before training goes on, so the
// files are those a blocking save writes, byte for byte (a .dtc for DDP, shards and metadata for
// ZeRO).
TEST_P(BackgroundSave, WritesWhatABlockingSaveWrites) {
  const std::string strategy = GetParam();
  auto dir = testing::scratch_dir("background_same_" + strategy);
  std::replace(dir.begin(), dir.end(), '-', '_');
  ASSERT_EQ(testing::run_ranks(2, "background_save", {dir, strategy, "same"}), 0);
  auto blocking = files_under(dir + "/blocking"), background = files_under(dir + "/background");
  ASSERT_FALSE(blocking.empty());
  ASSERT_EQ(blocking.size(), background.size());
  for (const auto& [name, bytes] : blocking) {
    ASSERT_TRUE(background.count(name)) << name;
    EXPECT_TRUE(background[name] == bytes) << name << " differs";
  }
}

// A kill -9 while a checkpoint is written in the background: the newest complete checkpoint
// is whole (the previous one when the kill came before the new one was published) and the
// job resumes from it.
TEST_P(BackgroundSave, KillDuringASaveLeavesACheckpointToResumeFrom) {
  const std::string strategy = GetParam();
  auto dir = testing::scratch_dir("background_kill_" + strategy);
  std::replace(dir.begin(), dir.end(), '-', '_');
  EXPECT_NE(testing::run_ranks(2, "background_save", {dir, strategy, "kill"}), 0);
  // Killed before the new checkpoint was published: its staging folder or temporary is left.
  const bool interrupted = unpublished_save(dir + "/a");
  if (strategy != "ddp") {  // sharded
    auto latest = checkpoint::latest_complete(dir + "/a");
    ASSERT_TRUE(latest);
    EXPECT_NO_THROW(checkpoint::ShardedCheckpointReader(*latest).verify());
  }
  ASSERT_EQ(testing::run_ranks(2, "background_save", {dir, strategy, "resume"}), 0);
  for (int r = 0; r < 2; ++r) {
    const std::string resumed = testing::read_file(str(dir, "/resumed-", r));
    EXPECT_EQ(resumed, interrupted ? "3" : "6") << "an unpublished save is not a checkpoint";
  }
}

INSTANTIATE_TEST_SUITE_P(Strategies, BackgroundSave,
                         ::testing::Values("ddp", "ddp-sharded", "zero3"));

// args: DIR PRECISION STRATEGY: writes the loss of each of 30 steps on one fixed batch.
DTORCH_TEST_WORKER(precision_curve) {
  auto comm = comm::Communicator::from_env();
  torch::manual_seed(5);
  auto model = models::make_model("gpt-debug");
  auto c = adamw(args.at(2));
  c.precision.compute = *value_named<Precision>(args.at(1));
  c.optimizer.lr = 3e-3;
  auto s = make_strategy(c, model, comm);
  std::ofstream out(str(args.at(0), "/", args.at(1), "_", args.at(2), "_", comm->rank()));
  for (int i = 0; i < 30; ++i)
    out << train_steps(*s, *model, 1, comm->rank()) << "\n";  // one batch, memorised
}

std::vector<double> curve(const std::string& path) {
  std::ifstream in(path);
  std::vector<double> v;
  for (double x; in >> x;)
    v.push_back(x);
  return v;
}

TEST(StrategyConfigCheck, OneCheckpointFileIsDdps) {
  StrategyConfig c;
  c.checkpoint_layout = CheckpointLayout::File;
  EXPECT_NO_THROW(validate(c));
  c.kind = StrategyKind::Zero1;
  try {
    validate(c);
    ADD_FAILURE() << "zero1 with --checkpoint-layout file was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("checkpoint consolidate"), std::string::npos) << e.what();
  }
}

TEST(StrategyConfigCheck, ReshardingTheRootNeedsZero3) {
  StrategyConfig c;
  c.reshard_root_after_forward = true;
  c.kind = StrategyKind::Zero3;
  EXPECT_NO_THROW(validate(c));
  c.kind = StrategyKind::Zero2;
  try {
    validate(c);
    ADD_FAILURE() << "zero2 with --reshard-root-after-forward was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--strategy zero3"), std::string::npos) << e.what();
  }
}

TEST(MixedPrecision, Bf16LossCurveStaysCloseToFp32) {
  auto dir = testing::scratch_dir("precision");
  for (const char* strategy : {"ddp", "zero3"}) {
    for (const char* p : {"fp32", "bf16"})
      ASSERT_EQ(testing::run_ranks(2, "precision_curve", {dir, p, strategy}), 0);
    auto fp32 = curve(str(dir, "/fp32_", strategy, "_0"));
    auto bf16 = curve(str(dir, "/bf16_", strategy, "_0"));
    ASSERT_EQ(fp32.size(), 30u);
    ASSERT_EQ(bf16.size(), 30u);
    EXPECT_LT(fp32.back(), fp32.front() - 0.5) << strategy << ": fp32 did not learn";
    for (size_t i = 0; i < fp32.size(); ++i)
      EXPECT_NEAR(bf16[i], fp32[i], 0.05 * fp32[i]) << strategy << " step " << i;
  }
}

}  // namespace
}  // namespace dtorch::train

namespace dtorch::train {
namespace {

// args: DIR. Two bf16 steps of resnet-debug (BatchNorm buffers follow the parameters' dtype)
// under every strategy; the loss must stay finite.
DTORCH_TEST_WORKER(bf16_resnet) {
  auto comm = comm::Communicator::from_env();
  for (const char* strategy : {"ddp", "zero1", "zero2", "zero3"}) {
    torch::manual_seed(3);
    auto model = models::make_model("resnet-debug");
    auto c = adamw(strategy);
    c.precision.compute = Precision::BF16;
    auto s = make_strategy(c, model, comm);
    for (int i = 0; i < 2; ++i) {
      torch::manual_seed(10 * i + comm->rank());
      auto x = torch::randn({4, 1, 28, 28});
      auto y = torch::randint(0, 10, {4});
      torch::Tensor loss;
      {
        parallel::Autocast autocast(s->autocast());
        loss = cross_entropy(model->forward(x), y);
      }
      s->backward(loss, true);
      s->step(1.0);
      DTORCH_CHECK(std::isfinite(loss.item<double>()), strategy, ": loss ", loss.item<double>());
    }
  }
}

TEST(MixedPrecision, ResNetWithBatchNormTrainsInBf16UnderEveryStrategy) {
  EXPECT_EQ(testing::run_ranks(2, "bf16_resnet", {testing::scratch_dir("bf16_resnet")}), 0);
}

}  // namespace
}  // namespace dtorch::train
