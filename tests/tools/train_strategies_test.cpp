// `dtorch train` with every debug model under every strategy at 2 ranks, as a user runs it:
// each finishes, writes metrics and the strategy's checkpoint, and learns something.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "dtorch/checkpoint/state_dict.h"
#include "dtorch/core/error.h"
#include "dtorch/core/paths.h"
#include "support/command.h"
#include "support/train_run.h"
#include "support/workers.h"

namespace dtorch {
namespace {

struct Case {
  const char* model;
  const char* strategy;
};
// What gtest (and ctest's test name) shows of a case: its words, not its bytes.
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.model << " " << c.strategy;
}

class TrainStrategies : public ::testing::TestWithParam<Case> {};

TEST_P(TrainStrategies, TwoRanksTrainAndCheckpoint) {
  auto [model, strategy] = GetParam();
  const bool text = std::string(model).rfind("gpt", 0) == 0;
  std::string out = testing::scratch_dir(str(model, strategy)) + "/run";
  std::vector<std::string> args{
      DTORCH_CLI,     "train", "--model", model,   "--strategy",       strategy,
      "--epochs",     "1",     "--out",   out,     "--progress",       "off",
      "--optimizer",  "adamw", "--lr",    "0.002", "--nproc-per-node", "2",
      "--batch-size", "16"};
  if (text) {
    args.insert(args.end(), {"--data", "text", "--seq-len", "32", "--train-samples", "960",
                             "--test-samples", "64"});
  } else {
    args.insert(args.end(), {"--train-samples", "640", "--test-samples", "256"});
  }
  auto r = testing::run_command(str("cmd_", model, strategy), args, 300);
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_TRUE(testing::contains(r.err, std::string("strategy: ") + strategy)) << r.err;
  auto epochs = testing::epochs_of(out);
  ASSERT_EQ(epochs.size(), 1u);
  const auto& m = epochs[0];
  // Better than chance: 10 classes, or 256 byte values (English text is far from uniform).
  EXPECT_GT(m["test_accuracy"].get<double>(), text ? 0.08 : 0.2) << m.dump();
  EXPECT_TRUE(paths::exists(out + "/model.pt"));
  if (std::string(strategy) == "ddp") {
    EXPECT_TRUE(paths::exists(out + "/checkpoint-000001.dtc"));
  } else {
    bool found = false;
    for (const std::string& name : paths::list_directory(out))
      found |= name.rfind("step-", 0) == 0 && paths::exists(out + "/" + name + "/metadata.json");
    EXPECT_TRUE(found) << "no sharded checkpoint in " << out;
    // The consolidated checkpoint holds the weights model.pt was written from.
    auto c =
        testing::run_command(str("consolidate_", model, strategy),
                             {DTORCH_CLI, "checkpoint", "consolidate", out, out + "/full.pt"}, 60);
    ASSERT_EQ(c.exit_code(), 0) << c.err;
    auto full = checkpoint::unpickle_state_dict(checkpoint::read_file(out + "/full.pt"), "full.pt");
    auto final =
        checkpoint::unpickle_state_dict(checkpoint::read_file(out + "/model.pt"), "model.pt");
    ASSERT_EQ(full.size(), final.size());
    std::map<std::string, torch::Tensor> by_name(final.begin(), final.end());
    for (const auto& [name, t] : full) {
      ASSERT_TRUE(by_name.count(name)) << name;
      EXPECT_TRUE(t.equal(by_name[name])) << name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    DebugModels, TrainStrategies,
    ::testing::Values(Case{"resnet-debug", "ddp"}, Case{"resnet-debug", "zero1"},
                      Case{"resnet-debug", "zero2"}, Case{"resnet-debug", "zero3"},
                      Case{"vit-debug", "ddp"}, Case{"vit-debug", "zero1"},
                      Case{"vit-debug", "zero2"}, Case{"vit-debug", "zero3"},
                      Case{"gpt-debug", "ddp"}, Case{"gpt-debug", "zero1"},
                      Case{"gpt-debug", "zero2"}, Case{"gpt-debug", "zero3"},
                      Case{"mnist-cnn", "zero3"}, Case{"mnist-mlp", "zero2"}),
    [](const auto& info) {
      std::string s = std::string(info.param.model) + "_" + info.param.strategy;
      for (auto& c : s)
        if (c == '-') c = '_';
      return s;
    });

}  // namespace
}  // namespace dtorch
