// Tests for the ResNets: torchvision's names, shapes and stages, and forward outputs equal to
// torchvision's own resnet18/resnet50 (with the same small-image stem) on our weights.
#include "dtorch/models/resnet.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dtorch/checkpoint/state_dict.h"
#include "dtorch/models/registry.h"
#include "models/interop.h"
#include "models/python_peer.h"
#include "support/workers.h"

namespace dtorch::models {
namespace {

std::map<std::string, std::vector<int64_t>> shapes(const torch::nn::Module& m) {
  std::map<std::string, std::vector<int64_t>> out;
  for (const auto& [name, t] : checkpoint::state_dict(m))
    out[name] = t.sizes().vec();
  return out;
}

TEST(ModelResNet, Resnet18NamesShapesAndStages) {
  auto m = make_model("resnet18");
  auto s = shapes(*m);
  EXPECT_EQ(s.at("conv1.weight"), (std::vector<int64_t>{64, 1, 3, 3}));
  EXPECT_EQ(s.at("bn1.running_var"), (std::vector<int64_t>{64}));
  EXPECT_EQ(s.at("layer1.1.conv2.weight"), (std::vector<int64_t>{64, 64, 3, 3}));
  EXPECT_EQ(s.at("layer2.0.downsample.0.weight"), (std::vector<int64_t>{128, 64, 1, 1}));
  EXPECT_EQ(s.at("layer4.1.bn2.num_batches_tracked"), (std::vector<int64_t>{}));
  EXPECT_EQ(s.at("fc.weight"), (std::vector<int64_t>{10, 512}));
  EXPECT_EQ(s.count("layer1.0.downsample.0.weight"), 0u);
  EXPECT_EQ(s.count("conv1.bias"), 0u);
  int64_t n = 0;
  for (const auto& p : m->parameters())
    n += p.numel();
  // torchvision's resnet18(num_classes=10) has 11,181,642; its 7x7x3 stem has 9,408 weights
  // where this 3x3x1 one has 576.
  EXPECT_EQ(n, 11181642 - 9408 + 576);
  EXPECT_EQ(m->block_names(), (std::vector<std::string>{"layer1", "layer2", "layer3", "layer4"}));
  EXPECT_FALSE(m->takes_tokens());
  EXPECT_EQ(m->forward(torch::randn({2, 1, 28, 28})).sizes(), (std::vector<int64_t>{2, 10}));
}

TEST(ModelResNet, Resnet50UsesBottlenecks) {
  auto s = shapes(*make_model("resnet50"));
  EXPECT_EQ(s.at("layer1.0.conv3.weight"), (std::vector<int64_t>{256, 64, 1, 1}));
  EXPECT_EQ(s.at("layer1.0.downsample.0.weight"), (std::vector<int64_t>{256, 64, 1, 1}));
  EXPECT_EQ(s.at("layer3.5.bn3.weight"), (std::vector<int64_t>{1024}));
  EXPECT_EQ(s.at("fc.weight"), (std::vector<int64_t>{10, 2048}));
}

TEST(ModelResNet, DebugConfigIsTinyAndRunsOn32x32) {
  ResNet m(ResNetConfig::debug());
  int64_t n = 0;
  for (const auto& p : m.parameters())
    n += p.numel();
  EXPECT_LT(n, 200000);
  EXPECT_EQ(m.forward(torch::randn({3, 1, 32, 32})).sizes(), (std::vector<int64_t>{3, 10}));
  EXPECT_EQ(shapes(m).at("layer4.0.downsample.1.weight"), (std::vector<int64_t>{64}));
}

// torchvision's model with our stem, loaded with our state dict; outputs in eval mode
// (running statistics) and train mode (batch statistics).
nlohmann::json compare_with_torchvision(const std::string& name) {
  dtorch::testing::TempDir tmp("resnet-peer-" + name);
  const std::string& dir = tmp.path();
  torch::manual_seed(3);
  auto model = make_model(name);
  dtorch::testing::perturb_constant_tensors(*model);
  checkpoint::save_state_dict(*model, dir + "/weights.pt");
  torch::Tensor x = torch::randn({4, 1, 28, 28});
  torch::NoGradGuard no_grad;
  model->eval();
  torch::Tensor y_eval = model->forward(x);
  model->train();
  torch::Tensor y_train = model->forward(x);
  dtorch::testing::save_tensors(dir + "/io.pt", {{"x", x}, {"eval", y_eval}, {"train", y_train}});
  return dtorch::testing::python_json(dir, R"PY(
try:
    import torchvision
except ImportError:
    print(json.dumps({"skip": "no torchvision for " + sys.executable + " (make test installs it)"}))
    sys.exit(0)
net = getattr(torchvision.models, sys.argv[2])(num_classes=10)
net.conv1 = torch.nn.Conv2d(1, 64, 3, 1, 1, bias=False)
net.maxpool = torch.nn.Identity()
ours = torch.load("weights.pt")
theirs = net.state_dict()
missing = sorted(set(theirs) - set(ours))
unexpected = sorted(set(ours) - set(theirs))
shape_diff = [k for k in theirs if k in ours and theirs[k].shape != ours[k].shape]
net.load_state_dict(ours, strict=True)
io = torch.load("io.pt")
with torch.no_grad():
    net.eval()
    d_eval = (net(io["x"]) - io["eval"]).abs().max().item()
    net.train()
    d_train = (net(io["x"]) - io["train"]).abs().max().item()
print(json.dumps({"missing": missing, "unexpected": unexpected, "shape_diff": shape_diff,
                  "eval_diff": d_eval, "train_diff": d_train,
                  "scale": io["eval"].abs().max().item()}))
)PY",
                                      {name});
}

class ModelResNetPeer : public ::testing::TestWithParam<const char*> {};

TEST_P(ModelResNetPeer, MatchesTorchvision) {
  DTORCH_SKIP_WITHOUT_PYTHON(/*need_peer=*/false);
  auto r = compare_with_torchvision(GetParam());
  ASSERT_FALSE(r.is_null());
  if (r.contains("skip")) GTEST_SKIP() << r["skip"].get<std::string>();
  EXPECT_TRUE(r["missing"].empty()) << r.dump();
  EXPECT_TRUE(r["unexpected"].empty()) << r.dump();
  EXPECT_TRUE(r["shape_diff"].empty()) << r.dump();
  EXPECT_GT(r["scale"].get<double>(), 0.01) << r.dump();
  // 1e-5 relative to the logits' size: resnet50's reach about 20, and LibTorch 2.x's C++ and
  // Python convolutions round differently at that depth (1.3e-5 absolute, 6e-7 relative).
  const double tol = 1e-5 * std::max(1.0, r["scale"].get<double>());
  EXPECT_LE(r["eval_diff"].get<double>(), tol) << r.dump();
  EXPECT_LE(r["train_diff"].get<double>(), tol) << r.dump();
}

INSTANTIATE_TEST_SUITE_P(Depths, ModelResNetPeer, ::testing::Values("resnet18", "resnet50"));

}  // namespace
}  // namespace dtorch::models
