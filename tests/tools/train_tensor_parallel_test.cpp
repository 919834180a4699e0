// `dtorch train --tp 2` on 4 ranks (dp 2 x tp 2) under ddp, zero1 and zero2 over the dp group,
// and with sequence parallelism: the loss curve and the final weights are those of the same
// job run data-parallel only on 2 ranks, and the final model file is whole. A DDP checkpoint
// written at tp 2, as one file or shared by the tp ranks, resumes at tp 2, at tp 1 and at dp 4
// with identical parameters (Note [Tensor-parallel checkpoints]); ZeRO's per-tp checkpoints
// refuse another --tp by name.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>

#include "dtorch/checkpoint/checkpoint.h"
#include "dtorch/checkpoint/state_dict.h"
#include "dtorch/core/error.h"
#include "dtorch/core/paths.h"
#include "dtorch/models/registry.h"
#include "models/interop.h"
#include "models/python_peer.h"
#include "support/command.h"
#include "support/train_run.h"
#include "support/workers.h"

namespace dtorch {
namespace {

using testing::epochs_of;
using testing::model_file;

std::vector<std::string> tp_train_args(const std::string& out, const std::string& strategy,
                                       int nproc) {
  return testing::gpt_debug_train_args(out, strategy, nproc);
}

TEST(TrainTensorParallel, DataTimesTensorMatchesDataParallelOnly) {
  std::string ref = testing::scratch_dir("tp_ref") + "/run";
  auto r = testing::run_command("tp_ref", tp_train_args(ref, "ddp", 2), 300);
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  auto want = epochs_of(ref);
  ASSERT_EQ(want.size(), 2u);
  auto want_model =
      checkpoint::unpickle_state_dict(checkpoint::read_file(ref + "/model.pt"), "model.pt");
  std::map<std::string, torch::Tensor> want_by_name(want_model.begin(), want_model.end());

  struct Case {
    std::string strategy;
    bool sequence_parallel;
  };
  for (const Case& c :
       {Case{"ddp", false}, Case{"zero1", false}, Case{"zero2", false}, Case{"ddp", true}}) {
    const std::string name = c.strategy + (c.sequence_parallel ? "_sp" : "");
    std::string out = testing::scratch_dir("tp_" + name) + "/run";
    auto args = tp_train_args(out, c.strategy, 4);
    args.insert(args.end(), {"--tp", "2"});
    if (c.sequence_parallel) args.push_back("--sequence-parallel");
    auto t = testing::run_command("tp_" + name, args, 300);
    ASSERT_EQ(t.exit_code(), 0) << name << "\n" << t.err;
    EXPECT_TRUE(testing::contains(t.err, "mesh: dp 2 x tp 2")) << t.err;
    auto got = epochs_of(out);
    ASSERT_EQ(got.size(), 2u) << name;
    for (size_t e = 0; e < 2; ++e) {
      for (const char* key : {"train_loss", "test_loss", "test_accuracy"}) {
        EXPECT_NEAR(got[e][key].get<double>(), want[e][key].get<double>(), 1e-4)
            << name << " epoch " << e << " " << key;
      }
    }
    // The final model file is whole (every tensor the dp-only run's shape) and holds the
    // same weights; key biases aside (their gradient is rounding noise, see
    // tests/parallel/tp/tensor_parallel_test.cpp), within float tolerance.
    auto model =
        checkpoint::unpickle_state_dict(checkpoint::read_file(out + "/model.pt"), "model.pt");
    ASSERT_EQ(model.size(), want_model.size()) << name;
    for (const auto& [key, tensor] : model) {
      ASSERT_TRUE(want_by_name.count(key)) << key;
      ASSERT_EQ(tensor.sizes(), want_by_name[key].sizes()) << key;
      if (key.find("c_attn.bias") != std::string::npos) continue;
      EXPECT_LE((tensor - want_by_name[key]).abs().max().item<double>(), 1e-4)
          << name << " " << key;
    }
    if (c.strategy == "ddp") {
      EXPECT_TRUE(paths::exists(out + "/checkpoint-000002.dtc")) << name;
    } else {
      EXPECT_TRUE(paths::exists(out + "/tp0-of-2")) << name;
      EXPECT_TRUE(paths::exists(out + "/tp1-of-2")) << name;
      // consolidate joins the tp folders into the whole model the final file holds.
      auto k = testing::run_command(
          "tp_consolidate_" + name,
          {DTORCH_CLI, "checkpoint", "consolidate", out, out + "/full.pt"}, 60);
      ASSERT_EQ(k.exit_code(), 0) << k.err;
      auto full =
          checkpoint::unpickle_state_dict(checkpoint::read_file(out + "/full.pt"), "full.pt");
      std::map<std::string, torch::Tensor> final(model.begin(), model.end());
      ASSERT_EQ(full.size(), final.size()) << name;
      for (const auto& [key, tensor] : full)
        EXPECT_TRUE(tensor.equal(final[key])) << name << " " << key;
    }
  }
}

// Trains at dp 1 x tp 2 (with `save_flags`) for one epoch of two, then resumes at tp 1 for
// the second, which must be the uninterrupted run's, and at dp 4 and at tp 2 with nothing left
// to train, which must write the loaded weights back unchanged. Returns the weights after one
// epoch; consolidate, applied to the checkpoint, must give them.
std::map<std::string, torch::Tensor> expect_tp2_checkpoint_resumes(
    const std::string& base, const std::vector<std::string>& save_flags) {
  auto with_tp = [&save_flags](std::vector<std::string> a) {
    a.insert(a.end(), {"--tp", "2"});
    a.insert(a.end(), save_flags.begin(), save_flags.end());
    return a;
  };
  // Uninterrupted: dp 1 x tp 2 for two epochs.
  auto r = testing::run_command("tp_whole", with_tp(tp_train_args(base + "/whole", "ddp", 2)), 300);
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  // One epoch at tp 2, then on at tp 1 (one process: dp stays 1, so the data are the same).
  auto first = with_tp(tp_train_args(base + "/split", "ddp", 2));
  first[std::find(first.begin(), first.end(), "--epochs") - first.begin() + 1] = "1";
  r = testing::run_command("tp_first", first, 300);
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  paths::copy_tree(base + "/split", base + "/dp4");
  paths::copy_tree(base + "/split", base + "/tp2");
  auto after_one = model_file(base + "/split/model.pt");
  // The checkpoint is the whole model: consolidate gives the weights model.pt was written from.
  const auto files = checkpoint::list_checkpoints(base + "/split");
  r = testing::run_command("tp_consolidate",
                           {DTORCH_CLI, "checkpoint", "consolidate",
                            files.empty() ? base + "/split" : files.front(), base + "/full.pt"},
                           60);
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  for (const auto& [k, t] : model_file(base + "/full.pt"))
    EXPECT_TRUE(t.equal(after_one[k])) << k;

  auto resume = tp_train_args(base + "/split", "ddp", 1);
  resume.push_back("--resume");
  r = testing::run_command("tp_resume_tp1", resume, 300);
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_TRUE(testing::contains(r.err, "resuming from")) << r.err;
  auto whole = epochs_of(base + "/whole"), split = epochs_of(base + "/split");
  EXPECT_EQ(split.size(), 2u);
  for (const char* key : {"train_loss", "test_loss"})
    if (split.size() == 2u && whole.size() == 2u)
      EXPECT_NEAR(split[1][key].get<double>(), whole[1][key].get<double>(), 1e-4) << key;
  auto want = model_file(base + "/whole/model.pt");
  for (const auto& [k, t] : model_file(base + "/split/model.pt")) {
    if (k.find("c_attn.bias") != std::string::npos) continue;  // see the test above
    EXPECT_LE((t - want[k]).abs().max().item<double>(), 1e-4) << k;
  }

  // At dp 4 (no tensor parallelism), with nothing left to train: the loaded weights are
  // written back unchanged.
  auto dp4 = tp_train_args(base + "/dp4", "ddp", 4);
  dp4[std::find(dp4.begin(), dp4.end(), "--epochs") - dp4.begin() + 1] = "1";
  dp4.push_back("--resume");
  r = testing::run_command("tp_resume_dp4", dp4, 300);
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  for (const auto& [k, t] : model_file(base + "/dp4/model.pt"))
    EXPECT_TRUE(t.equal(after_one[k])) << k;

  // And at the tp it was saved with.
  auto tp2 = with_tp(tp_train_args(base + "/tp2", "ddp", 2));
  tp2[std::find(tp2.begin(), tp2.end(), "--epochs") - tp2.begin() + 1] = "1";
  tp2.push_back("--resume");
  r = testing::run_command("tp_resume_tp2", tp2, 300);
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_TRUE(testing::contains(r.err, "resuming from")) << r.err;
  for (const auto& [k, t] : model_file(base + "/tp2/model.pt"))
    EXPECT_TRUE(t.equal(after_one[k])) << k;
  return after_one;
}

TEST(TrainTensorParallel, DdpCheckpointAtTp2ResumesAtTp1AndAtDp4) {
  const std::string base = testing::scratch_dir("tp_any_layout");
  expect_tp2_checkpoint_resumes(base, {});
  // Python's nanoGPT loads it strictly, as written (lm_head.weight aliases the embedding, Note
  // [Tied embedding]), and computes dtorch's logits.
  if (testing::python_unavailable_reason(false).empty()) {
    auto gpt = models::make_model("gpt-debug");
    checkpoint::load_state_dict(*gpt, base + "/full.pt");
    torch::NoGradGuard no_grad;
    torch::Tensor x = torch::randint(0, 256, {2, 32}, torch::kLong);
    testing::save_tensors(base + "/io.pt", {{"x", x}, {"y", gpt->forward(x)}});
    auto py = testing::python_json(base, testing::nanogpt_debug_python() + R"PY(
net = GPT()
ours = torch.load("full.pt")
net.load_state_dict(ours, strict=True)
io = torch.load("io.pt")
with torch.no_grad():
    print(json.dumps({"max_abs_diff": (net(io["x"]) - io["y"]).abs().max().item()}))
)PY");
    ASSERT_FALSE(py.is_null());
    EXPECT_LE(py["max_abs_diff"].get<double>(), 1e-5) << py.dump();
  }
}

// Note [Tensor-parallel checkpoints] with the saves shared (Note [Saving replicated state]):
// the two tp ranks, which gathered the unsplit model, each wrote some of its tensors, as
// shards that resume as the one file does.
TEST(TrainTensorParallel, DdpSharedCheckpointAtTp2ResumesAtTp1AndAtDp4) {
  const std::string base = testing::scratch_dir("tp_shared_any_layout");
  expect_tp2_checkpoint_resumes(base, {"--checkpoint-layout", "sharded"});
  testing::expect_every_rank_wrote_shards(base + "/whole", 2);
}

TEST(TrainTensorParallel, ZeroCheckpointsRefuseAnotherTpByName) {
  std::string out = testing::scratch_dir("tp_resume") + "/run";
  auto args = tp_train_args(out, "zero1", 2);
  args.insert(args.end(), {"--tp", "2"});
  args[std::find(args.begin(), args.end(), "--epochs") - args.begin() + 1] = "1";
  auto t = testing::run_command("tp_resume", args, 300);
  ASSERT_EQ(t.exit_code(), 0) << t.err;
  auto again = tp_train_args(out, "ddp", 2);
  again.push_back("--resume");
  auto r = testing::run_command("tp_resume_tp1", again, 300);
  EXPECT_NE(r.exit_code(), 0);
  EXPECT_TRUE(testing::contains(r.err, "the ZeRO checkpoints in")) << r.err;
  EXPECT_TRUE(testing::contains(r.err, "were written with --tp 2 and this run has --tp 1"))
      << r.err;
}

TEST(TrainTensorParallel, BadCombinationsAreConfigErrors) {
  std::string out = testing::scratch_dir("tp_bad") + "/run";
  auto sp = tp_train_args(out, "ddp", 1);
  sp.push_back("--sequence-parallel");
  auto r = testing::run_command("tp_bad_sp", sp, 120);
  EXPECT_NE(r.exit_code(), 0);
  EXPECT_TRUE(testing::contains(r.err, "needs --tp 2 or more")) << r.err;
  auto three = tp_train_args(out, "ddp", 2);
  three.insert(three.end(), {"--tp", "3"});
  r = testing::run_command("tp_bad_3", three, 120);
  EXPECT_NE(r.exit_code(), 0);
  EXPECT_TRUE(testing::contains(r.err, "does not divide the job's 2 ranks")) << r.err;
}

}  // namespace
}  // namespace dtorch
