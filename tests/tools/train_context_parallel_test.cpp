// `dtorch train --cp 2` on 4 ranks (dp 2 x cp 2), ring attention under ZeRO-1 and Ulysses under
// DDP: the loss curve and the final weights are those of the same job run data-parallel only on
// 2 ranks (the cp ranks of a replica read the same batches), and a checkpoint written at cp 2
// resumes at cp 1 (parameters are whole on every cp rank); vit-debug at --cp 2 (its 17 tokens
// padded to 20) trains as it does on one rank (under SGD: on LibTorch 2.x one rank's fused
// attention rounds otherwise than the ring, and AdamW scales that noise in the query and key
// weights' small gradients up to its step size). Layouts context parallelism cannot
// run are ConfigErrors naming the fix (a model without a plan: tests/parallel/cp).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

#include "dtorch/core/paths.h"
#include "support/command.h"
#include "support/train_run.h"
#include "support/workers.h"

namespace dtorch {
namespace {

using testing::epochs_of;
using testing::model_file;
using testing::with;

// The 2-rank dp-only run's epochs and model, made once.
struct Reference {
  std::vector<nlohmann::json> epochs;
  std::map<std::string, torch::Tensor> model;
};
const Reference& reference() {
  static const Reference ref = [] {
    std::string out = testing::scratch_dir("cp_ref") + "/run";
    auto r = testing::run_command("cp_ref_run", testing::gpt_debug_train_args(out, "ddp", 2), 300);
    EXPECT_EQ(r.exit_code(), 0) << r.err;
    return Reference{epochs_of(out), model_file(out + "/model.pt")};
  }();
  return ref;
}

void expect_reference(const std::string& out, const std::string& name) {
  const Reference& want = reference();
  auto got = epochs_of(out);
  ASSERT_EQ(got.size(), want.epochs.size()) << name;
  for (size_t e = 0; e < got.size(); ++e) {
    for (const char* key : {"train_loss", "test_loss", "test_accuracy"}) {
      EXPECT_NEAR(got[e][key].get<double>(), want.epochs[e][key].get<double>(), 1e-4)
          << name << " epoch " << e << " " << key;
    }
  }
  auto model = model_file(out + "/model.pt");
  ASSERT_EQ(model.size(), want.model.size()) << name;
  for (const auto& [key, tensor] : model) {
    // Key biases aside: their gradient is rounding noise (tests/parallel/tp).
    if (key.find("c_attn.bias") != std::string::npos) continue;
    EXPECT_LE((tensor - want.model.at(key)).abs().max().item<double>(), 1e-4) << name << " " << key;
  }
}

// `args` with each flag of `more` (flag, value pairs) set: its value replaced, or appended.
std::vector<std::string> set_flags(std::vector<std::string> args,
                                   const std::vector<std::string>& more) {
  for (size_t i = 0; i + 1 < more.size(); i += 2) {
    auto at = std::find(args.begin(), args.end(), more[i]);
    if (at != args.end()) {
      *(at + 1) = more[i + 1];
    } else {
      args.insert(args.end(), {more[i], more[i + 1]});
    }
  }
  return args;
}

TEST(TrainContextParallel, UlyssesUnderDdpMatchesDataParallelOnly) {
  std::string out = testing::scratch_dir("cp_ulysses") + "/run";
  auto t = testing::run_command("cp_ulysses_run",
                                set_flags(testing::gpt_debug_train_args(out, "ddp", 4),
                                          {"--cp", "2", "--cp-kind", "ulysses"}),
                                300);
  ASSERT_EQ(t.exit_code(), 0) << t.err;
  EXPECT_TRUE(testing::contains(
      t.err, "mesh: dp 2 x cp 2 (context parallel: ulysses attention, 16 tokens per rank)"))
      << t.err;
  expect_reference(out, "ulysses");
}

TEST(TrainContextParallel, RingUnderZero1ResumesAtCp1AndMatchesDataParallelOnly) {
  std::string out = testing::scratch_dir("cp_ring") + "/run";
  auto first = set_flags(testing::gpt_debug_train_args(out, "zero1", 4, 1), {"--cp", "2"});
  auto t = testing::run_command("cp_ring_first", first, 300);
  ASSERT_EQ(t.exit_code(), 0) << t.err;
  // Epoch 2 at cp 1 on 2 ranks: the same dp 2, so the same batches.
  auto again = testing::gpt_debug_train_args(out, "zero1", 2);
  again.push_back("--resume");
  t = testing::run_command("cp_ring_resume", again, 300);
  ASSERT_EQ(t.exit_code(), 0) << t.err;
  expect_reference(out, "ring, resumed at cp 1");
}

TEST(TrainContextParallel, VitSplitsItsOwnSequenceAndMatchesOneRank) {
  const std::string dir = testing::scratch_dir("cp_vit");
  auto args = [&](const std::string& out, int nproc) {
    return std::vector<std::string>{DTORCH_CLI,
                                    "train",
                                    "--model",
                                    "vit-debug",
                                    "--epochs",
                                    "1",
                                    "--out",
                                    out,
                                    "--progress",
                                    "off",
                                    "--optimizer",
                                    "sgd",
                                    "--lr",
                                    "0.05",
                                    "--batch-size",
                                    "16",
                                    "--nproc-per-node",
                                    std::to_string(nproc),
                                    "--train-samples",
                                    "256",
                                    "--test-samples",
                                    "64"};
  };
  auto one = testing::run_command("cp_vit_one", args(dir + "/one", 1), 300);
  ASSERT_EQ(one.exit_code(), 0) << one.err;
  auto t = testing::run_command("cp_vit_cp2", with(args(dir + "/cp2", 2), {"--cp", "2"}), 300);
  ASSERT_EQ(t.exit_code(), 0) << t.err;
  EXPECT_TRUE(
      testing::contains(t.err, "mesh: cp 2 (context parallel: ring attention, 10 tokens per rank)"))
      << t.err;
  testing::expect_same_run(dir + "/cp2", dir + "/one", "vit-debug cp 2");
}

TEST(TrainContextParallel, LayoutsItCannotRunAreConfigErrors) {
  const std::string out = testing::scratch_dir("cp_bad") + "/run";
  struct Case {
    std::vector<std::string> flags;
    int nproc;
    std::string says;
  };
  for (const Case& c : {
           Case{{"--cp", "2", "--seq-len", "30"}, 2, "a sequence of 30 tokens does not divide"},
           Case{{"--cp", "3", "--cp-kind", "ulysses"}, 3, "use --cp-kind ring, or a --cp that"},
           Case{{"--cp", "2", "--pp", "2"}, 4, "context parallelism does not run under a "},
           Case{{"--cp-kind", "ulysses"}, 1, "--cp-kind applies to context parallelism"},
       }) {
    auto r = testing::run_command(
        "cp_bad_run", set_flags(testing::gpt_debug_train_args(out, "ddp", c.nproc), c.flags), 120);
    EXPECT_NE(r.exit_code(), 0) << c.says;
    EXPECT_TRUE(testing::contains(r.err, c.says)) << r.err;
    EXPECT_FALSE(testing::contains(r.err, ".cpp:")) << r.err;
  }
}

}  // namespace
}  // namespace dtorch
