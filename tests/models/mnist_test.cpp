// Tests for the MNIST models: the peer's parameter names and shapes, the registry, and
// forward outputs equal to the Python peer's Net/MLP run on the same weights and input.
#include "dtorch/models/mnist.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "dtorch/checkpoint/state_dict.h"
#include "dtorch/core/error.h"
#include "dtorch/models/registry.h"
#include "models/interop.h"
#include "models/python_peer.h"
#include "support/workers.h"

namespace dtorch::models {
namespace {

using Shapes = std::vector<std::pair<std::string, std::vector<int64_t>>>;

Shapes shapes_of(const torch::nn::Module& m) {
  Shapes out;
  for (const auto& kv : m.named_parameters())
    out.emplace_back(kv.key(), kv.value().sizes().vec());
  return out;
}

TEST(ModelMnist, CnnHasThePeersParameters) {
  MnistCnn m;
  EXPECT_EQ(shapes_of(m), (Shapes{{"conv1.weight", {32, 1, 3, 3}},
                                  {"conv1.bias", {32}},
                                  {"conv2.weight", {64, 32, 3, 3}},
                                  {"conv2.bias", {64}},
                                  {"fc1.weight", {128, 9216}},
                                  {"fc1.bias", {128}},
                                  {"fc2.weight", {10, 128}},
                                  {"fc2.bias", {10}}}));
  EXPECT_TRUE(m.named_buffers().is_empty());
  EXPECT_EQ(m.forward(torch::randn({3, 1, 28, 28})).sizes(), (std::vector<int64_t>{3, 10}));
}

TEST(ModelMnist, MlpHasThePeersParameters) {
  MnistMlp m;
  EXPECT_EQ(shapes_of(m), (Shapes{{"fc1.weight", {256, 784}},
                                  {"fc1.bias", {256}},
                                  {"fc2.weight", {256, 256}},
                                  {"fc2.bias", {256}},
                                  {"fc3.weight", {10, 256}},
                                  {"fc3.bias", {10}}}));
  EXPECT_EQ(m.forward(torch::randn({2, 1, 28, 28})).sizes(), (std::vector<int64_t>{2, 10}));
  EXPECT_EQ(m.forward(torch::randn({2, 784})).sizes(), (std::vector<int64_t>{2, 10}));
}

TEST(ModelRegistry, MakesModelsByName) {
  EXPECT_EQ(model_names(),
            (std::vector<std::string>{"gpt-debug", "gpt-large", "gpt-long", "gpt-small", "gpt-xl",
                                      "mnist-cnn", "mnist-mlp", "resnet-debug", "resnet18",
                                      "resnet50", "vit-debug", "vit-tiny"}));
  EXPECT_NE(std::dynamic_pointer_cast<MnistCnn>(make_model("mnist-cnn")), nullptr);
  EXPECT_NE(std::dynamic_pointer_cast<MnistMlp>(make_model("mnist-mlp")), nullptr);
  try {
    make_model("resnet-1000");
    FAIL();
  } catch (const ConfigError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("resnet-1000"), std::string::npos) << msg;
    EXPECT_NE(msg.find("mnist-cnn, mnist-mlp"), std::string::npos) << msg;
  }
}

TEST(ModelRegistry, BuildsImageModelsForTheDatasInput) {
  const ImageInput rgb{3, 32, 5};
  for (const char* name : {"mnist-cnn", "mnist-mlp", "resnet-debug", "vit-tiny"}) {
    auto m = make_model(name, {}, rgb);
    EXPECT_EQ(m->forward(torch::randn({2, 3, 32, 32})).sizes(), (std::vector<int64_t>{2, 5}))
        << name;
  }
  EXPECT_EQ(make_model("mnist-cnn", {}, rgb)->named_parameters()["fc1.weight"].size(1),
            64 * 14 * 14);
  try {
    make_model("vit-debug", {}, rgb);  // 7x7 patches
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("use --image-size 28"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_model("mnist-cnn", {}, {3, 32, 1}), ConfigError);  // one class
  EXPECT_TRUE(python_aliases("mnist-cnn").empty());
  ASSERT_EQ(python_aliases("gpt-large").size(), 1u);
  EXPECT_EQ(python_aliases("gpt-large")[0].alias, "lm_head.weight");
}

// Runs the peer's model class on C++ weights and input; returns Python's JSON verdict.
nlohmann::json compare_with_peer(const std::string& name, const std::string& peer_class) {
  dtorch::testing::TempDir tmp("model-peer-" + name);
  const std::string& dir = tmp.path();
  torch::manual_seed(1);
  auto model = make_model(name);
  torch::Tensor x = torch::randn({8, 1, 28, 28});
  torch::Tensor y = model->forward(x).detach();
  checkpoint::save_state_dict(*model, dir + "/weights.pt");
  dtorch::testing::save_tensors(dir + "/io.pt", {{"x", x}, {"y", y}});

  // Also: does the same seed give the same initial weights in both languages?
  torch::manual_seed(0);
  auto seeded = make_model(name);
  checkpoint::save_state_dict(*seeded, dir + "/seed0.pt");

  std::string out;
  int rc = dtorch::testing::run_python(dir, "compare", R"PY(
cls = getattr(peer, sys.argv[2])
net = cls()
net.load_state_dict(torch.load("weights.pt"), strict=True)
io = torch.load("io.pt")
with torch.no_grad():
    diff = (net(io["x"]) - io["y"]).abs().max().item()
torch.manual_seed(0)
fresh = cls()
init = max((p - q).abs().max().item()
           for p, q in zip(fresh.state_dict().values(), torch.load("seed0.pt").values()))
print(json.dumps({"max_abs_diff": diff, "init_diff": init}))
)PY",
                                       {peer_class}, &out);
  EXPECT_EQ(rc, 0) << out;
  if (rc != 0) return {};
  return nlohmann::json::parse(out.substr(out.rfind('{')));
}

TEST(ModelPeer, CnnForwardMatchesPython) {
  DTORCH_SKIP_WITHOUT_PYTHON(/*need_peer=*/true);
  auto r = compare_with_peer("mnist-cnn", "Net");
  ASSERT_FALSE(r.is_null());
  EXPECT_LE(r["max_abs_diff"].get<double>(), 1e-5) << r.dump();
  EXPECT_EQ(r["init_diff"].get<double>(), 0.0) << "same seed, same initial weights: " << r.dump();
}

TEST(ModelPeer, MlpForwardMatchesPython) {
  DTORCH_SKIP_WITHOUT_PYTHON(/*need_peer=*/true);
  auto r = compare_with_peer("mnist-mlp", "MLP");
  ASSERT_FALSE(r.is_null());
  EXPECT_LE(r["max_abs_diff"].get<double>(), 1e-5) << r.dump();
  EXPECT_EQ(r["init_diff"].get<double>(), 0.0) << "same seed, same initial weights: " << r.dump();
}

}  // namespace
}  // namespace dtorch::models
