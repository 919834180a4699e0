// The model files `dtorch train` and `dtorch checkpoint consolidate` write load into the
// Python modules their users have with load_state_dict(..., strict=True), as written: nanoGPT's
// GPT with lm_head.weight tied to transformer.wte.weight (one storage, two keys, as torch.save
// writes tied weights), torchvision's VisionTransformer with the documented stem change, after
// ZeRO-3, a pipeline and ZeRO-2 runs; safetensors files through safetensors.torch.load_model.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "dtorch/checkpoint/state_dict.h"
#include "dtorch/models/registry.h"
#include "dtorch/models/vit.h"
#include "models/interop.h"
#include "models/python_peer.h"
#include "support/command.h"
#include "support/workers.h"

namespace dtorch {
namespace {

using testing::contains;
using testing::run_command;

// Trains `model` for one short epoch into DIR/NAME with `more` flags, then consolidates its
// newest checkpoint CHECKPOINT (relative to the run folder) to full.pt and full.safetensors.
void train_and_consolidate(const std::string& dir, const std::string& name,
                           const std::vector<std::string>& more, const std::string& checkpoint) {
  const std::string out = dir + "/" + name;
  std::vector<std::string> args{
      DTORCH_CLI,       "train", "--epochs",     "1", "--train-samples",  "64",
      "--test-samples", "32",    "--batch-size", "8", "--nproc-per-node", "2",
      "--progress",     "off",   "--out",        out};
  args.insert(args.end(), more.begin(), more.end());
  auto r = run_command("interop_" + name, args, 300);
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  for (const char* file : {"full.pt", "full.safetensors"}) {
    r = run_command(
        "interop_consolidate_" + name,
        {DTORCH_CLI, "checkpoint", "consolidate", out + "/" + checkpoint, out + "/" + file}, 120);
    ASSERT_EQ(r.exit_code(), 0) << r.err;
  }
}

TEST(PythonInterop, GptFilesLoadStrictlyIntoNanoGptWithTheTiedHead) {
  DTORCH_SKIP_WITHOUT_PYTHON(/*need_peer=*/false);
  const std::string dir = testing::scratch_dir("interop_gpt");
  train_and_consolidate(dir, "zero3",
                        {"--model", "gpt-debug", "--data", "text", "--strategy", "zero3"}, ".");
  train_and_consolidate(dir, "pp2", {"--model", "gpt-debug", "--data", "text", "--pp", "2"}, ".");
  // dtorch reads the tied head back too: the C++ model loads what Python would.
  auto gpt = models::make_model("gpt-debug");
  EXPECT_NO_THROW(checkpoint::load_state_dict(*gpt, dir + "/zero3/model.pt"));
  auto py = testing::python_json(dir, testing::nanogpt_debug_python() + R"PY(
try:
    from safetensors.torch import load_model
except ImportError:
    load_model = None
out = {}
for run in ("zero3", "pp2"):
    for f in ("model.pt", "full.pt"):
        sd = torch.load(f"{run}/{f}", weights_only=True)
        net = GPT()
        net.load_state_dict(sd, strict=True)
        out[f"{run}/{f}"] = {
            "tied": sd["lm_head.weight"].data_ptr() == sd["transformer.wte.weight"].data_ptr(),
            "net_tied": net.lm_head.weight is net.transformer.wte.weight,
            "keys": len(sd)}
    a = torch.load(f"{run}/model.pt")
    b = torch.load(f"{run}/full.pt")
    out[run + "/same"] = all(torch.equal(a[k], b[k]) for k in a) and set(a) == set(b)
    if load_model:
        net = GPT()
        load_model(net, f"{run}/full.safetensors", strict=True)
        out[run + "/safetensors"] = torch.equal(net.transformer.wte.weight, a["transformer.wte.weight"])
print(json.dumps(out))
)PY");
  ASSERT_FALSE(py.is_null());
  const size_t keys = checkpoint::state_dict(*gpt).size() + 1;
  for (const char* run : {"zero3", "pp2"}) {
    for (const char* f : {"/model.pt", "/full.pt"}) {
      const auto& r = py[std::string(run) + f];
      EXPECT_TRUE(r["tied"].get<bool>()) << run << f << ": one storage under two keys";
      EXPECT_TRUE(r["net_tied"].get<bool>()) << run << f << ": loading left the tie in place";
      EXPECT_EQ(r["keys"].get<size_t>(), keys) << run << f;
    }
    EXPECT_TRUE(py[std::string(run) + "/same"].get<bool>()) << run;
    if (py.contains(std::string(run) + "/safetensors")) {
      EXPECT_TRUE(py[std::string(run) + "/safetensors"].get<bool>()) << run;
    }
  }
}

TEST(PythonInterop, VitFilesLoadStrictlyIntoTorchvision) {
  DTORCH_SKIP_WITHOUT_PYTHON(/*need_peer=*/false);
  const std::string dir = testing::scratch_dir("interop_vit");
  train_and_consolidate(dir, "zero2", {"--model", "vit-debug", "--strategy", "zero2"}, ".");
  auto model = models::make_model("vit-debug");
  const auto c = std::dynamic_pointer_cast<models::VisionTransformer>(model)->config();
  auto py = testing::python_json(dir, testing::torchvision_vit_python() + R"PY(
out = {}
for f in ("model.pt", "full.pt"):
    net = torchvision_vit()
    net.load_state_dict(torch.load("zero2/" + f, weights_only=True), strict=True)
    out[f] = True
print(json.dumps(out))
)PY",
                                 testing::torchvision_vit_args(c));
  ASSERT_FALSE(py.is_null());
  if (py.contains("skip")) GTEST_SKIP() << py["skip"].get<std::string>();
  EXPECT_TRUE(py["model.pt"].get<bool>());
  EXPECT_TRUE(py["full.pt"].get<bool>());
}

TEST(PythonInterop, UntiedWeightsUnderTheAliasAreRefused) {
  auto gpt = models::make_model("gpt-debug");
  auto state = checkpoint::with_python_aliases(checkpoint::state_dict(*gpt), gpt->python_aliases());
  ASSERT_EQ(state.size(), checkpoint::state_dict(*gpt).size() + 1);
  EXPECT_EQ(state[1].first, "lm_head.weight") << "right after transformer.wte.weight";
  EXPECT_NO_THROW(checkpoint::check_state_dict(*gpt, state, "tied.pt"));
  state[1].second = state[1].second.clone() + 1;
  try {
    checkpoint::check_state_dict(*gpt, state, "untied.pt");
    ADD_FAILURE() << "untied weights were accepted";
  } catch (const CheckpointError& e) {
    EXPECT_TRUE(contains(e.what(), "untied.pt: lm_head.weight differs from transformer.wte.weight"))
        << e.what();
  }
}

}  // namespace
}  // namespace dtorch
