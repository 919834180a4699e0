// Reading a training run's metrics and model file.
#include "support/train_run.h"

#include <gtest/gtest.h>

#include <sstream>

#include "dtorch/checkpoint/checkpoint.h"
#include "dtorch/checkpoint/sharded_checkpoint.h"
#include "dtorch/checkpoint/state_dict.h"
#include "support/command.h"

namespace dtorch::testing {

std::vector<std::string> gpt_debug_train_args(const std::string& out, const std::string& strategy,
                                              int nproc, int epochs) {
  return {DTORCH_CLI,
          "train",
          "--model",
          "gpt-debug",
          "--data",
          "text",
          "--seq-len",
          "32",
          "--strategy",
          strategy,
          "--epochs",
          std::to_string(epochs),
          "--out",
          out,
          "--progress",
          "off",
          "--optimizer",
          "adamw",
          "--lr",
          "0.002",
          "--batch-size",
          "8",
          "--nproc-per-node",
          std::to_string(nproc),
          "--train-samples",
          "128",
          "--test-samples",
          "32"};
}

std::vector<nlohmann::json> records_of(const std::string& out, const std::string& kind) {
  std::vector<nlohmann::json> v;
  std::istringstream in(read_file(out + "/metrics.jsonl"));
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line);
    if (j.value("kind", "") == kind) v.push_back(j);
  }
  return v;
}

std::vector<nlohmann::json> epochs_of(const std::string& out) {
  return records_of(out, "epoch");
}

std::map<std::string, torch::Tensor> model_file(const std::string& path) {
  auto v = checkpoint::unpickle_state_dict(checkpoint::read_file(path), path);
  return {v.begin(), v.end()};
}

void expect_same_run(const std::string& got, const std::string& want, const std::string& name) {
  auto g = epochs_of(got), w = epochs_of(want);
  ASSERT_EQ(g.size(), w.size()) << name;
  for (size_t e = 0; e < g.size(); ++e) {
    for (const char* key : {"train_loss", "test_loss", "test_accuracy"}) {
      EXPECT_NEAR(g[e][key].get<double>(), w[e][key].get<double>(), 1e-4)
          << name << " epoch " << e << " " << key;
    }
  }
  auto gm = model_file(got + "/model.pt"), wm = model_file(want + "/model.pt");
  ASSERT_EQ(gm.size(), wm.size()) << name;
  for (const auto& entry : gm) {
    const std::string& key = entry.first;  // a lambda below captures it: no structured binding
    const torch::Tensor& t = entry.second;
    ASSERT_TRUE(wm.count(key)) << name << " " << key;
    auto named = [&](const char* gpt, const char* vit) {
      return key.find(gpt) != std::string::npos || key.find(vit) != std::string::npos;
    };
    if (named("c_attn.bias", "in_proj_bias")) continue;  // key bias: rounding noise
    // Query and key weights get small gradients that Adam scales up: the reference itself,
    // run with 1 thread instead of 2, moves them by 8e-5 (LibTorch 2.15); sequence
    // parallelism's other summation order, by 2e-4.
    const double tolerance = named("c_attn.weight", "in_proj_weight") ? 5e-4 : 1e-4;
    EXPECT_LE((t - wm[key]).abs().max().item<double>(), tolerance) << name << " " << key;
  }
}

void expect_every_rank_wrote_shards(const std::string& folder, int ranks) {
  EXPECT_TRUE(checkpoint::list_checkpoints(folder).empty()) << folder;
  const auto shards = checkpoint::latest_complete(folder);
  ASSERT_TRUE(shards) << folder;
  checkpoint::ShardedCheckpointReader reader(*shards);
  std::vector<int> tensors(ranks, 0);
  for (const auto& [key, info] : reader.flat_tensors())
    for (int r = 0; r < ranks; ++r)
      tensors[r] += info.ranges.at(r).second > info.ranges.at(r).first;
  for (int r = 0; r < ranks; ++r)
    EXPECT_GT(tensors[r], 0) << folder << ": rank " << r << " wrote nothing";
}

}  // namespace dtorch::testing
