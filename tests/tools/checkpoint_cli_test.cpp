// `dtorch checkpoint inspect|consolidate` as a user runs them, on the toy checkpoint that 4
// ranks saved (checkpoint/sharded_fixture.h); PyTorch itself loads the consolidated model.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <torch/torch.h>

#include "checkpoint/sharded_fixture.h"
#include "dtorch/checkpoint/checkpoint.h"
#include "dtorch/checkpoint/safetensors.h"
#include "dtorch/checkpoint/state_dict.h"
#include "dtorch/core/paths.h"
#include "models/python_peer.h"
#include "support/command.h"
#include "support/workers.h"

namespace dtorch {
namespace {

using testing::contains;
using testing::run_command;

TEST(CheckpointCli, ConsolidatedModelLoadsInPyTorch) {
  std::string dir = testing::toy_checkpoint_copy("ckpt-cli-consolidate");
  const std::string out = dir + "/model.pt";
  auto r =
      run_command("ckpt-cli-consolidate-cmd", {DTORCH_CLI, "checkpoint", "consolidate", dir, out});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_TRUE(contains(r.out, "8 tensors")) << r.out;
  EXPECT_TRUE(contains(r.out, "global step 20")) << r.out;

  // Read back in C++: names, shapes and values against the fixture's formula.
  auto state = checkpoint::unpickle_state_dict(checkpoint::read_file(out), out);
  std::map<std::string, torch::Tensor> got(state.begin(), state.end());
  ASSERT_EQ(got.size(), 8u);
  EXPECT_TRUE(torch::equal(
      got.at("fc.weight"),
      testing::toy_flat(20, "param/1", 7, torch::kFloat).narrow(0, 0, 6).view({3, 2})));

  DTORCH_SKIP_WITHOUT_PYTHON(false);
  std::string output;
  int rc = testing::run_python(dir, "load_consolidated", R"(
import sys, torch
sd = torch.load(sys.argv[2])
def flat(step, key, n):
    code = sum(key.encode()) % 97
    return torch.arange(n, dtype=torch.float64) * 0.5 + (step * 1000 + code)
p0, p1, p2 = flat(20, "param/0", 10), flat(20, "param/1", 7), flat(20, "param/2", 3)
want = {
    "conv.weight": p0[0:8].view(2, 1, 2, 2), "conv.bias": p0[8:10],
    "fc.weight": p1[0:6].view(3, 2), "fc.bias": p1[6:7],
    "scale": p2[0].reshape(()), "gain": p2[1:3],
    "bn.running_mean": torch.tensor([20.25, 20.75]),
    "bn.num_batches_tracked": torch.tensor(20),
}
assert sorted(sd) == sorted(want), sorted(sd)
for k, v in want.items():
    assert sd[k].shape == v.shape, (k, sd[k].shape, v.shape)
    assert torch.equal(sd[k].double(), v.double()), (k, sd[k], v)
assert sd["conv.weight"].dtype == torch.float32
assert sd["bn.num_batches_tracked"].dtype == torch.int64
print("PYTHON OK", len(sd))
)",
                               {out}, &output);
  EXPECT_EQ(rc, 0) << output;
  EXPECT_TRUE(contains(output, "PYTHON OK 8")) << output;
}

// OUT's suffix picks the format: .safetensors gives what the safetensors package reads.
TEST(CheckpointCli, ConsolidatesToSafetensorsByFileName) {
  std::string dir = testing::toy_checkpoint_copy("ckpt-cli-safetensors");
  const std::string pt = dir + "/model.pt", st = dir + "/model.safetensors";
  for (const auto& out : {pt, st}) {
    auto r = run_command("ckpt-cli-safetensors-cmd",
                         {DTORCH_CLI, "checkpoint", "consolidate", dir, out});
    ASSERT_EQ(r.exit_code(), 0) << r.err;
  }
  auto bytes = checkpoint::read_file(st);
  ASSERT_TRUE(checkpoint::looks_like_safetensors(bytes));
  auto from_st = checkpoint::parse_safetensors(bytes, st);
  auto from_pt = checkpoint::unpickle_state_dict(checkpoint::read_file(pt), pt);
  ASSERT_EQ(from_st.size(), from_pt.size());
  for (size_t i = 0; i < from_st.size(); ++i) {
    EXPECT_EQ(from_st[i].first, from_pt[i].first);
    EXPECT_TRUE(torch::equal(from_st[i].second, from_pt[i].second)) << from_st[i].first;
  }

  DTORCH_SKIP_WITHOUT_PYTHON(false);
  std::string output;
  int rc = testing::run_python(dir, "load_safetensors", R"(
import sys, torch
try:
    from safetensors.torch import load_file
except ImportError:
    print("SKIP no safetensors package for " + sys.executable)
    sys.exit(0)
st, pt = load_file(sys.argv[2]), torch.load(sys.argv[3])
assert list(st) == list(pt), (list(st), list(pt))
for k in st:
    assert st[k].dtype == pt[k].dtype and torch.equal(st[k], pt[k]), k
print("PYTHON OK", len(st))
)",
                               {st, pt}, &output);
  ASSERT_EQ(rc, 0) << output;
  if (contains(output, "SKIP no safetensors")) GTEST_SKIP() << output;
  EXPECT_TRUE(contains(output, "PYTHON OK 8")) << output;
}

TEST(CheckpointCli, InspectShowsContentsAndVerifiesFiles) {
  std::string dir = testing::toy_checkpoint_copy("ckpt-cli-inspect");
  auto r = run_command("ckpt-cli-inspect-cmd", {DTORCH_CLI, "checkpoint", "inspect", dir});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  for (const char* want :
       {"step-000020", "format       version 1", "world size   4", "epoch        2",
        "global step  20", R"(metadata     {"model":"toy","strategy":"zero2"})",
        "unit 0: param/0, 10 elements, 2 parameters", "conv.weight", "[2, 1, 2, 2]",
        "unit 2: param/2, 3 elements", "scale", "optim/1/momentum_buffer", "optim/step",
        "bn.running_mean", "shard-00003-of-00004.pt", "full.pt"}) {
    EXPECT_TRUE(contains(r.out, want)) << want << "\n" << r.out;
  }
  EXPECT_FALSE(contains(r.out, "BAD")) << r.out;

  // A corrupt shard of the step inspected directly: listed as bad, exit code 1.
  const std::string step = dir + "/step-000020";
  const std::string shard = step + "/shard-00002-of-00004.pt";
  paths::resize_file(shard, 100);
  r = run_command("ckpt-cli-inspect-bad", {DTORCH_CLI, "checkpoint", "inspect", step});
  EXPECT_EQ(r.exit_code(), 1);
  EXPECT_TRUE(contains(r.out, "shard-00002-of-00004.pt")) << r.out;
  EXPECT_TRUE(contains(r.out, "BAD: truncated")) << r.out;
  EXPECT_TRUE(contains(r.err, "1 file(s)")) << r.err;
  EXPECT_TRUE(contains(r.err, "older step directory")) << r.err;
  // The run directory falls back to step 10, saying why.
  r = run_command("ckpt-cli-inspect-run", {DTORCH_CLI, "checkpoint", "inspect", dir});
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_TRUE(contains(r.out, "global step  10")) << r.out;
  EXPECT_TRUE(contains(r.err, "shard-00002-of-00004.pt")) << r.err;
}

// A one-file checkpoint is inspected as one: its data and model, its length and CRC-32
// verified; a truncated one is named.
TEST(CheckpointCli, InspectReadsAOneFileCheckpoint) {
  const std::string dir = testing::scratch_dir("ckpt-cli-inspect-dtc");
  torch::nn::Linear model(3, 2);
  checkpoint::save_checkpoint(dir, {4, 40, R"({"model":"linear"})"}, *model, nullptr);
  const std::string file = dir + "/checkpoint-000004.dtc";
  auto r = run_command("ckpt-cli-inspect-dtc-cmd", {DTORCH_CLI, "checkpoint", "inspect", file});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  for (const char* want : {"format       one file", "epoch        4", "global step  40",
                           R"(metadata     {"model":"linear"})", "weight", "[2, 3]",
                           "length and CRC-32 ok"})
    EXPECT_TRUE(contains(r.out, want)) << want << "\n" << r.out;
  paths::resize_file(file, 100);
  r = run_command("ckpt-cli-inspect-dtc-bad", {DTORCH_CLI, "checkpoint", "inspect", file});
  EXPECT_EQ(r.exit_code(), 1);
  EXPECT_TRUE(contains(r.err, "checkpoint-000004.dtc")) << r.err;
  EXPECT_FALSE(contains(r.err, "not a directory")) << r.err;
}

TEST(CheckpointCli, NotACheckpointIsAClearError) {
  std::string dir = testing::scratch_dir("ckpt-cli-not");
  auto r = run_command("ckpt-cli-not-cmd", {DTORCH_CLI, "checkpoint", "inspect", dir});
  EXPECT_EQ(r.exit_code(), 1);
  EXPECT_TRUE(contains(r.err, "not a sharded checkpoint")) << r.err;
  r = run_command("ckpt-cli-not-cmd2",
                  {DTORCH_CLI, "checkpoint", "consolidate", dir, dir + "/model.pt"});
  EXPECT_EQ(r.exit_code(), 1);
  EXPECT_FALSE(paths::exists(dir + "/model.pt"));
}

// consolidate never writes over what it reads: a checkpoint's file, a step folder, a .dtc name,
// a folder or a FIFO as OUT is refused before anything is read, and the checkpoint stays whole.
TEST(CheckpointCli, AnOutputThatIsAnInputIsRefused) {
  const std::string dir = testing::toy_checkpoint_copy("ckpt-cli-out-is-in");
  std::string step;
  for (const auto& name : paths::list_directory(dir))
    if (name.rfind("step-", 0) == 0) step = dir + "/" + name;
  ASSERT_FALSE(step.empty());
  ASSERT_EQ(::mkfifo((dir + "/fifo.pt").c_str(), 0600), 0);
  const std::vector<std::pair<std::string, std::string>> refused{
      {step + "/metadata.json", "is inside the sharded checkpoint"},
      {step + "/model.pt", "is inside the sharded checkpoint"},
      {dir + "/checkpoint-000003.dtc", "has a checkpoint's name (.dtc)"},
      {step, "is a folder, not a file name"},
      {dir + "/fifo.pt", "is a FIFO (named pipe), and dtorch replaces only regular files"},
  };
  for (const auto& [out, why] : refused) {
    auto r =
        run_command("ckpt-cli-out-is-in-cmd", {DTORCH_CLI, "checkpoint", "consolidate", dir, out});
    EXPECT_NE(r.exit_code(), 0) << out;
    EXPECT_TRUE(contains(r.err, why)) << out << ": " << r.err;
    EXPECT_FALSE(contains(r.out, "wrote")) << r.out;
  }
  auto r = run_command("ckpt-cli-out-is-in-inspect", {DTORCH_CLI, "checkpoint", "inspect", dir});
  EXPECT_EQ(r.exit_code(), 0) << "the checkpoint is intact: " << r.err;
  EXPECT_EQ(paths::kind(dir + "/fifo.pt"), "a FIFO (named pipe)");
}

}  // namespace
}  // namespace dtorch
