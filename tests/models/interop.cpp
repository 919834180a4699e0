// Helpers for the model interop tests (see interop.h): pickled tensor files, perturbation of
// constant initial values, and the Python run that prints one JSON verdict.
#include "models/interop.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dtorch/checkpoint/state_dict.h"
#include "dtorch/core/paths.h"
#include "models/python_peer.h"
#include "support/workers.h"

namespace dtorch::testing {

TempDir::TempDir(const std::string& name) : path_(scratch_dir(name)) {}

TempDir::~TempDir() {
  std::error_code ec;
  paths::remove_all(path_, ec);
}

void save_tensors(const std::string& path,
                  const std::vector<std::pair<std::string, torch::Tensor>>& tensors) {
  checkpoint::write_file_atomically(path, checkpoint::pickle_state_dict(tensors));
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

std::string torchvision_vit_python() {
  return R"PY(
try:
    from torchvision.models.vision_transformer import VisionTransformer
except ImportError:
    print(json.dumps({"skip": "no torchvision for " + sys.executable + " (make test installs it)"}))
    sys.exit(0)
def torchvision_vit():
    p, layers, heads, hidden, mlp = map(int, sys.argv[2:7])
    net = VisionTransformer(28, p, layers, heads, hidden, mlp, num_classes=10)
    net.conv_proj = torch.nn.Conv2d(1, hidden, p, p)
    return net
)PY";
}

std::vector<std::string> torchvision_vit_args(const models::ViTConfig& c) {
  return {std::to_string(c.patch_size), std::to_string(c.num_layers), std::to_string(c.num_heads),
          std::to_string(c.hidden_dim), std::to_string(c.mlp_dim)};
}

std::string nanogpt_debug_python() {
  return R"PY(
import math
import torch.nn as nn
import torch.nn.functional as F
V, BS, L, H, C = 256, 32, 2, 4, 32

class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.register_buffer("bias", torch.tril(torch.ones(BS, BS)).view(1, 1, BS, BS),
                             persistent=False)
    def forward(self, x):
        B, T, _ = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        k = k.view(B, T, H, C // H).transpose(1, 2)
        q = q.view(B, T, H, C // H).transpose(1, 2)
        v = v.view(B, T, H, C // H).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)

class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc = nn.Linear(C, 4 * C)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * C, C)
    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C)
        self.attn = CausalSelfAttention()
        self.ln_2 = nn.LayerNorm(C)
        self.mlp = MLP()
    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))

class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(V, C), wpe=nn.Embedding(BS, C),
            h=nn.ModuleList([Block() for _ in range(L)]), ln_f=nn.LayerNorm(C)))
        self.lm_head = nn.Linear(C, V, bias=False)
        self.transformer.wte.weight = self.lm_head.weight
    def forward(self, idx):
        pos = torch.arange(0, idx.size(1), dtype=torch.long)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))

)PY";
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
