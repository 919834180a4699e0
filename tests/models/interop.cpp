// Helpers for the model interop tests (see interop.h): pickled tensor files, perturbation of
// constant initial values, and the Python run that prints one JSON verdict.
#include "models/interop.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "dtorch/train/state_dict.h"
#include "models/python_peer.h"
#include "support/workers.h"

namespace dtorch::testing {

TempDir::TempDir(const std::string& name) : path_(scratch_dir(name)) {}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

void save_tensors(const std::string& path,
                  const std::vector<std::pair<std::string, torch::Tensor>>& tensors) {
  train::write_file_atomically(path, train::pickle_state_dict(tensors));
}

void perturb_constant_tensors(torch::nn::Module& module) {
  torch::NoGradGuard no_grad;
  auto perturb = [](torch::Tensor t) {
    if (!t.is_floating_point() || t.numel() == 0) return;
    if ((t == t.flatten()[0]).all().item<bool>()) t.add_(torch::randn_like(t) * 0.1);
  };
  for (auto& p : module.parameters())
    perturb(p);
  for (auto& b : module.buffers())
    perturb(b);
}

nlohmann::json python_json(const std::string& dir, const std::string& code,
                           const std::vector<std::string>& args) {
  std::string out;
  int rc = run_python(dir, "compare", code, args, &out);
  EXPECT_EQ(rc, 0) << out;
  std::string verdict;
  for (size_t pos = 0; pos < out.size();) {
    size_t end = out.find('\n', pos);
    if (end == std::string::npos) end = out.size();
    if (out[pos] == '{') verdict = out.substr(pos, end - pos);
    pos = end + 1;
  }
  if (rc != 0 || verdict.empty()) {
    ADD_FAILURE() << "no JSON verdict from Python:\n" << out;
    return nullptr;
  }
  return nlohmann::json::parse(verdict);
}

}  // namespace dtorch::testing
