// Reading a training run's metrics and model file.
#include "support/train_run.h"

#include <sstream>

#include "dtorch/train/state_dict.h"
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
          "256",
          "--test-samples",
          "64"};
}

std::vector<nlohmann::json> epochs_of(const std::string& out) {
  std::vector<nlohmann::json> v;
  std::istringstream in(read_file(out + "/metrics.jsonl"));
  for (std::string line; std::getline(in, line);)
    v.push_back(nlohmann::json::parse(line));
  return v;
}

std::map<std::string, torch::Tensor> model_file(const std::string& path) {
  auto v = train::unpickle_state_dict(train::read_file(path), path);
  return {v.begin(), v.end()};
}

}  // namespace dtorch::testing
