// Tests for the Vision Transformers: torchvision's names and shapes, encoder blocks, and
// forward outputs equal to torchvision's own VisionTransformer on our weights.
#include "dtorch/models/vit.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dtorch/checkpoint/state_dict.h"
#include "dtorch/core/error.h"
#include "dtorch/models/registry.h"
#include "models/interop.h"
#include "models/python_peer.h"
#include "support/workers.h"

namespace dtorch::models {
namespace {

TEST(ModelViT, TinyNamesAndShapes) {
  auto m = make_model("vit-tiny");
  std::map<std::string, std::vector<int64_t>> s;
  for (const auto& [name, t] : checkpoint::state_dict(*m))
    s[name] = t.sizes().vec();
  const std::string b = "encoder.layers.encoder_layer_11.";
  EXPECT_EQ(s.at("class_token"), (std::vector<int64_t>{1, 1, 192}));
  EXPECT_EQ(s.at("conv_proj.weight"), (std::vector<int64_t>{192, 1, 4, 4}));
  EXPECT_EQ(s.at("encoder.pos_embedding"), (std::vector<int64_t>{1, 50, 192}));
  EXPECT_EQ(s.at(b + "ln_1.weight"), (std::vector<int64_t>{192}));
  EXPECT_EQ(s.at(b + "self_attention.in_proj_weight"), (std::vector<int64_t>{576, 192}));
  EXPECT_EQ(s.at(b + "self_attention.in_proj_bias"), (std::vector<int64_t>{576}));
  EXPECT_EQ(s.at(b + "self_attention.out_proj.weight"), (std::vector<int64_t>{192, 192}));
  EXPECT_EQ(s.at(b + "mlp.0.weight"), (std::vector<int64_t>{768, 192}));
  EXPECT_EQ(s.at(b + "mlp.3.weight"), (std::vector<int64_t>{192, 768}));
  EXPECT_EQ(s.at("encoder.ln.bias"), (std::vector<int64_t>{192}));
  EXPECT_EQ(s.at("heads.head.weight"), (std::vector<int64_t>{10, 192}));
  // 4 top-level tensors, 12 per block (ln_1, attn in/out, ln_2, mlp.0, mlp.3), ln, head.
  EXPECT_EQ(s.size(), 4u + 12u * 12u + 2u + 2u);
  auto names = m->block_names();
  ASSERT_EQ(names.size(), 12u);
  EXPECT_EQ(names.front(), "encoder.layers.encoder_layer_0");
  EXPECT_EQ(names.back(), "encoder.layers.encoder_layer_11");
}

TEST(ModelViT, DebugForwardShapeAndBadConfig) {
  torch::manual_seed(0);
  VisionTransformer m(ViTConfig::debug());
  torch::Tensor x = torch::randn({3, 1, 28, 28});
  EXPECT_EQ(m.forward(x).sizes(), (std::vector<int64_t>{3, 10}));
  EXPECT_THROW(VisionTransformer(ViTConfig{28, 5, 1, 1, 1, 8, 8, 10}), ConfigError);
}

TEST(ModelViTPeer, DebugAndTinyMatchTorchvision) {
  DTORCH_SKIP_WITHOUT_PYTHON(/*need_peer=*/false);
  for (const std::string name : {"vit-debug", "vit-tiny"}) {
    SCOPED_TRACE(name);
    dtorch::testing::TempDir tmp("vit-peer-" + name);
    const std::string& dir = tmp.path();
    torch::manual_seed(5);
    auto model = make_model(name);
    const ViTConfig c = std::dynamic_pointer_cast<VisionTransformer>(model)->config();
    dtorch::testing::perturb_constant_tensors(*model);
    checkpoint::save_state_dict(*model, dir + "/weights.pt");
    torch::Tensor x = torch::randn({4, 1, 28, 28});
    torch::NoGradGuard no_grad;
    torch::Tensor y = model->forward(x);
    dtorch::testing::save_tensors(dir + "/io.pt", {{"x", x}, {"y", y}});
    auto r = dtorch::testing::python_json(dir, dtorch::testing::torchvision_vit_python() + R"PY(
net = torchvision_vit()
ours = torch.load("weights.pt")
theirs = net.state_dict()
names_differ = sorted(set(theirs) ^ set(ours))
net.load_state_dict(ours, strict=True)
io = torch.load("io.pt")
with torch.no_grad():
    net.train()  # the plain path; eval() may take the fused MultiheadAttention fast path
    d_train = (net(io["x"]) - io["y"]).abs().max().item()
    net.eval()
    d_eval = (net(io["x"]) - io["y"]).abs().max().item()
print(json.dumps({"names_differ": names_differ, "train_diff": d_train, "eval_diff": d_eval,
                  "scale": io["y"].abs().max().item()}))
)PY",
                                          dtorch::testing::torchvision_vit_args(c));
    ASSERT_FALSE(r.is_null());
    if (r.contains("skip")) GTEST_SKIP() << r["skip"].get<std::string>();
    EXPECT_TRUE(r["names_differ"].empty()) << r.dump();
    EXPECT_GT(r["scale"].get<double>(), 0.01) << r.dump();
    EXPECT_LE(r["train_diff"].get<double>(), 1e-5) << r.dump();
    EXPECT_LE(r["eval_diff"].get<double>(), 1e-5) << r.dump();
  }
}

}  // namespace
}  // namespace dtorch::models
