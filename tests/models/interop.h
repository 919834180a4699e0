// Test helpers for comparing a dtorch model with an equivalent PyTorch model: write tensors
// torch.load reads, randomise constant initial values, and read Python's JSON verdict.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "dtorch/models/vit.h"

namespace dtorch::testing {

/// A fresh scratch directory (support/workers.h scratch_dir) removed with everything in it
/// when this goes out of scope: model weights files run to ~100 MB.
class TempDir {
 public:
  explicit TempDir(const std::string& name);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

/// Writes name -> tensor as a pickled dict (torch.load gives a dict).
void save_tensors(const std::string& path,
                  const std::vector<std::pair<std::string, torch::Tensor>>& tensors);

/// Adds noise (std 0.1) to every floating parameter and buffer whose elements are all equal
/// (zero biases, LayerNorm and BatchNorm affine terms and statistics, class tokens), so a
/// forward comparison depends on each of them. Call it before saving the state dict.
void perturb_constant_tensors(torch::nn::Module& module);

/// Python source defining GPT(): nanoGPT's model.py (bias on, dropout 0, no flash attention,
/// lm_head tied to transformer.wte), trimmed to the forward pass, shaped as gpt-debug.
std::string nanogpt_debug_python();

/// Python source defining torchvision_vit(): torchvision's VisionTransformer shaped as the dtorch
/// ViT whose numbers torchvision_vit_args gives (the script's arguments), with the documented
/// stem change (one input channel). Without torchvision it prints {"skip": why} and exits.
std::string torchvision_vit_python();
/// The script arguments torchvision_vit_python reads: patch, layers, heads, width, MLP width.
std::vector<std::string> torchvision_vit_args(const models::ViTConfig& c);

/// Runs `code` with run_python from `dir`; returns the JSON object of the last line that
/// starts with '{', or null after a failed test assertion showing the output.
nlohmann::json python_json(const std::string& dir, const std::string& code,
                           const std::vector<std::string>& args = {});

}  // namespace dtorch::testing
