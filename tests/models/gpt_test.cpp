// Tests for the GPT: nanoGPT's names, GPT-2 small's parameter count and initialisation,
// causality, and logits equal to a nanoGPT-equivalent PyTorch model loaded with our weights.
#include "dtorch/models/gpt.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "dtorch/checkpoint/state_dict.h"
#include "dtorch/core/error.h"
#include "dtorch/models/registry.h"
#include "models/interop.h"
#include "models/python_peer.h"
#include "support/workers.h"

namespace dtorch::models {
namespace {

TEST(ModelGPT, DebugNamesShapesAndBlocks) {
  auto m = make_model("gpt-debug");
  std::vector<std::string> names;
  std::map<std::string, std::vector<int64_t>> s;
  for (const auto& [name, t] : checkpoint::state_dict(*m)) {
    names.push_back(name);
    s[name] = t.sizes().vec();
  }
  const std::vector<std::string> block = {
      "ln_1.weight",        "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
      "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",        "ln_2.bias",
      "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};
  std::vector<std::string> expected = {"transformer.wte.weight", "transformer.wpe.weight"};
  for (int i = 0; i < 2; ++i)
    for (const auto& n : block)
      expected.push_back("transformer.h." + std::to_string(i) + "." + n);
  expected.push_back("transformer.ln_f.weight");
  expected.push_back("transformer.ln_f.bias");
  EXPECT_EQ(names, expected) << "nanoGPT's names, no lm_head, no mask buffer";
  EXPECT_EQ(s.at("transformer.wte.weight"), (std::vector<int64_t>{256, 32}));
  EXPECT_EQ(s.at("transformer.wpe.weight"), (std::vector<int64_t>{32, 32}));
  EXPECT_EQ(s.at("transformer.h.1.attn.c_attn.weight"), (std::vector<int64_t>{96, 32}));
  EXPECT_EQ(s.at("transformer.h.1.mlp.c_proj.weight"), (std::vector<int64_t>{32, 128}));
  EXPECT_EQ(m->block_names(), (std::vector<std::string>{"transformer.h.0", "transformer.h.1"}));
  EXPECT_TRUE(m->takes_tokens());

  int64_t n = 0;
  for (const auto& p : m->parameters())
    n += p.numel();
  EXPECT_EQ(n, gpt_num_parameters(GPTConfig::debug()));
  EXPECT_EQ(m->forward(torch::randint(0, 256, {3, 32}, torch::kLong)).sizes(),
            (std::vector<int64_t>{3, 32, 256}));
}

TEST(ModelGPT, RejectsBadInput) {
  auto m = make_model("gpt-debug");
  EXPECT_THROW(m->forward(torch::zeros({2, 33}, torch::kLong)), ConfigError);
  EXPECT_THROW(m->forward(torch::zeros({2, 8})), ConfigError);
}

// Constructs GPT-2 small (no forward): nanoGPT's 124M parameters and initialisation.
TEST(ModelGPT, SmallHasGpt2SmallsParametersAndNanoGptInit) {
  torch::manual_seed(0);
  auto m = make_model("gpt-small");
  int64_t n = 0;
  for (const auto& p : m->parameters())
    n += p.numel();
  // nanoGPT prints 123.69M: it leaves out the 786,432 position weights.
  EXPECT_EQ(n, 124475904);
  EXPECT_EQ(gpt_num_parameters(GPTConfig::small()), 124475904);
  EXPECT_EQ(gpt_num_parameters(GPTConfig::large()), 774090240);  // GPT-2 large, padded vocab
  EXPECT_EQ(gpt_num_parameters(GPTConfig::xl()), 1557686400);    // GPT-2 XL, padded vocab
  auto p = m->named_parameters();
  auto std_of = [&](const std::string& k) { return p[k].std().item<double>(); };
  EXPECT_NEAR(std_of("transformer.wte.weight"), 0.02, 0.0005);
  EXPECT_NEAR(std_of("transformer.h.3.attn.c_attn.weight"), 0.02, 0.0005);
  EXPECT_NEAR(std_of("transformer.h.3.mlp.c_fc.weight"), 0.02, 0.0005);
  const double proj = 0.02 / std::sqrt(24.0);
  EXPECT_NEAR(std_of("transformer.h.3.attn.c_proj.weight"), proj, proj * 0.02);
  EXPECT_NEAR(std_of("transformer.h.11.mlp.c_proj.weight"), proj, proj * 0.02);
  EXPECT_EQ(p["transformer.h.0.mlp.c_fc.bias"].abs().max().item<double>(), 0.0);
  EXPECT_EQ(p["transformer.ln_f.weight"].min().item<double>(), 1.0);
  EXPECT_EQ(p["transformer.ln_f.bias"].abs().max().item<double>(), 0.0);
}

TEST(ModelGPT, LogitsDependOnlyOnEarlierTokens) {
  torch::manual_seed(1);
  auto m = make_model("gpt-debug");
  torch::NoGradGuard no_grad;
  torch::Tensor a = torch::randint(0, 256, {2, 20}, torch::kLong);
  torch::Tensor b = a.clone();
  b.slice(1, 12, 20).random_(0, 256);
  torch::Tensor la = m->forward(a), lb = m->forward(b);
  EXPECT_TRUE(torch::allclose(la.slice(1, 0, 12), lb.slice(1, 0, 12)));
  EXPECT_FALSE(torch::allclose(la.slice(1, 12, 20), lb.slice(1, 12, 20)));
}

TEST(ModelGPTPeer, DebugMatchesNanoGpt) {
  DTORCH_SKIP_WITHOUT_PYTHON(/*need_peer=*/false);
  dtorch::testing::TempDir tmp("gpt-peer");
  const std::string& dir = tmp.path();
  torch::manual_seed(7);
  auto model = make_model("gpt-debug");
  dtorch::testing::perturb_constant_tensors(*model);
  checkpoint::save_state_dict(*model, dir + "/weights.pt");
  torch::Tensor x = torch::randint(0, 256, {3, 32}, torch::kLong);
  torch::Tensor y = model->forward(x).detach();
  dtorch::testing::save_tensors(dir + "/io.pt", {{"x", x}, {"y", y}});
  auto r = dtorch::testing::python_json(dir, dtorch::testing::nanogpt_debug_python() + R"PY(
net = GPT()
ours = torch.load("weights.pt")
theirs = net.state_dict()
names_differ = sorted(set(theirs) ^ set(ours))
tied = ours["lm_head.weight"].data_ptr() == ours["transformer.wte.weight"].data_ptr()
net.load_state_dict(ours, strict=True)
io = torch.load("io.pt")
with torch.no_grad():
    diff = (net(io["x"]) - io["y"]).abs().max().item()
print(json.dumps({"names_differ": names_differ, "tied": tied, "max_abs_diff": diff,
                  "scale": io["y"].abs().max().item()}))
)PY");
  ASSERT_FALSE(r.is_null());
  EXPECT_TRUE(r["names_differ"].empty()) << "nanoGPT's keys, lm_head.weight included: " << r.dump();
  EXPECT_TRUE(r["tied"].get<bool>()) << "one storage under both names, as torch.save writes it";
  EXPECT_GT(r["scale"].get<double>(), 0.01) << r.dump();
  EXPECT_LE(r["max_abs_diff"].get<double>(), 1e-5) << r.dump();
}

}  // namespace
}  // namespace dtorch::models
