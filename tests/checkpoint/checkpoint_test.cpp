// Tests for training checkpoints: what a round trip restores (weights, optimizer state,
// counters, RNG), keep-last-K, and recovery from truncated, corrupt and foreign files.
#include "dtorch/checkpoint/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <fstream>

#include "dtorch/checkpoint/state_dict.h"
#include "dtorch/core/error.h"
#include "dtorch/core/paths.h"
#include "dtorch/models/registry.h"
#include "models/python_peer.h"
#include "support/workers.h"

namespace dtorch::checkpoint {
namespace {

// A few optimizer steps on fixed random data, so momentum / Adam moments are non-trivial.
void train_steps(models::Model& m, torch::optim::Optimizer& opt, int steps, int seed) {
  torch::Generator g = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (int i = 0; i < steps; ++i) {
    torch::Tensor x = torch::randn({8, 1, 28, 28}, g);
    torch::Tensor y = torch::randint(0, 10, {8}, g);
    opt.zero_grad();
    torch::nn::functional::cross_entropy(m.forward(x), y).backward();
    opt.step();
  }
}

void expect_same_params(const torch::nn::Module& a, const torch::nn::Module& b) {
  auto pa = a.parameters(), pb = b.parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i)
    EXPECT_TRUE(torch::equal(pa[i], pb[i])) << i;
}

std::string names(const std::vector<std::string>& paths) {
  std::string s;
  for (const auto& p : paths)
    s += paths::file_name(p) + " ";
  return s;
}

void truncate_file(const std::string& path, size_t keep) {
  auto bytes = read_file(path);
  bytes.resize(keep);
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), bytes.size());
}

void flip_byte(const std::string& path, size_t at) {
  auto bytes = read_file(path);
  bytes.at(at) ^= 0x40;
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), bytes.size());
}

template <typename Optim, typename Options>
void round_trip(const std::string& tag, Options options) {
  auto dir = dtorch::testing::scratch_dir("ckpt-roundtrip-" + tag);
  torch::manual_seed(3);
  auto a = models::make_model("mnist-mlp");
  Optim opt_a(a->parameters(), options);
  train_steps(*a, opt_a, 3, 11);
  save_checkpoint(dir, {2, 300, R"({"model":"mnist-mlp"})"}, *a, &opt_a);
  // Draws after the save, which a restore must replay.
  torch::Tensor expected_draw = torch::rand({5});

  torch::manual_seed(99);
  auto b = models::make_model("mnist-mlp");
  Optim opt_b(b->parameters(), options);
  torch::rand({17});
  auto loaded = load_latest_checkpoint(dir, *b, &opt_b);
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->data.epoch, 2);
  EXPECT_EQ(loaded->data.global_step, 300);
  EXPECT_EQ(loaded->data.metadata_json, R"({"model":"mnist-mlp"})");
  EXPECT_EQ(loaded->path, checkpoint_path(dir, 2));
  EXPECT_TRUE(torch::equal(torch::rand({5}), expected_draw)) << "RNG state restored";
  expect_same_params(*a, *b);
  // Same optimizer state: one more identical step keeps the models identical; without the
  // momentum / moment buffers they would diverge.
  train_steps(*a, opt_a, 1, 12);
  train_steps(*b, opt_b, 1, 12);
  expect_same_params(*a, *b);
}

TEST(Checkpoint, RoundTripWithSgdMomentum) {
  round_trip<torch::optim::SGD>("sgd", torch::optim::SGDOptions(0.01).momentum(0.9));
}

TEST(Checkpoint, RoundTripWithAdam) {
  round_trip<torch::optim::Adam>("adam", torch::optim::AdamOptions(1e-3));
}

TEST(Checkpoint, OptimizerStateReallyMatters) {
  // The control for the round trips above: a fresh optimizer does diverge.
  torch::manual_seed(3);
  auto a = models::make_model("mnist-mlp");
  auto b = models::make_model("mnist-mlp");
  load_state_dict(*b, state_dict(*a), "a");
  torch::optim::SGD opt_a(a->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  torch::optim::SGD opt_b(b->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  train_steps(*a, opt_a, 3, 11);
  load_state_dict(*b, state_dict(*a), "a");
  train_steps(*a, opt_a, 1, 12);
  train_steps(*b, opt_b, 1, 12);
  EXPECT_FALSE(torch::equal(a->parameters()[0], b->parameters()[0]));
}

TEST(Checkpoint, KeepsTheLastK) {
  auto dir = dtorch::testing::scratch_dir("ckpt-keep");
  auto m = models::make_model("mnist-mlp");
  torch::optim::SGD opt(m->parameters(), 0.1);
  for (int e = 1; e <= 5; ++e)
    save_checkpoint(dir, {e, e * 10, "{}"}, *m, &opt);
  EXPECT_EQ(names(list_checkpoints(dir)), "checkpoint-000005.dtc checkpoint-000004.dtc ");
  save_checkpoint(dir, {6, 60, "{}"}, *m, &opt, /*keep=*/3);
  EXPECT_EQ(names(list_checkpoints(dir)),
            "checkpoint-000006.dtc checkpoint-000005.dtc checkpoint-000004.dtc ");
  save_checkpoint(dir, {7, 70, "{}"}, *m, nullptr, /*keep=*/1);
  EXPECT_EQ(names(list_checkpoints(dir)), "checkpoint-000007.dtc ");
  EXPECT_THROW(save_checkpoint(dir, {8, 0, "{}"}, *m, &opt, 0), ConfigError);
  EXPECT_THROW(save_checkpoint(dir, {8, 0, "not json"}, *m, &opt), CheckpointError);
}

TEST(Checkpoint, OlderEpochWrittenAfterNewerOneIsKept) {
  // A new run reusing a directory: the file just written must survive pruning.
  auto dir = dtorch::testing::scratch_dir("ckpt-older");
  auto m = models::make_model("mnist-mlp");
  for (int e : {8, 9, 1})
    save_checkpoint(dir, {e, 0, "{}"}, *m, nullptr);
  EXPECT_EQ(names(list_checkpoints(dir)), "checkpoint-000009.dtc checkpoint-000001.dtc ");
}

TEST(Checkpoint, NoneGivesNullopt) {
  auto dir = dtorch::testing::scratch_dir("ckpt-none");
  auto m = models::make_model("mnist-mlp");
  EXPECT_FALSE(load_latest_checkpoint(dir, *m, nullptr).has_value());
  EXPECT_FALSE(load_latest_checkpoint(dir + "/absent", *m, nullptr).has_value());
}

// Saves epochs 1 and 2 with different weights; returns the epoch-1 weights.
torch::Tensor save_two(const std::string& dir, models::Model& m) {
  save_checkpoint(dir, {1, 10, "{}"}, m, nullptr);
  torch::Tensor first = m.parameters()[0].clone();
  {
    torch::NoGradGuard g;
    m.parameters()[0].add_(1);
  }
  save_checkpoint(dir, {2, 20, "{}"}, m, nullptr);
  return first;
}

TEST(Checkpoint, TruncatedNewestFallsBackWithWarning) {
  auto dir = dtorch::testing::scratch_dir("ckpt-truncated");
  auto m = models::make_model("mnist-mlp");
  torch::Tensor first = save_two(dir, *m);
  const std::string newest = checkpoint_path(dir, 2);
  truncate_file(newest, paths::file_size(newest) / 2);

  auto fresh = models::make_model("mnist-mlp");
  ::testing::internal::CaptureStderr();
  auto loaded = load_latest_checkpoint(dir, *fresh, nullptr);
  std::string err = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->data.epoch, 1);
  EXPECT_TRUE(torch::equal(fresh->parameters()[0], first));
  EXPECT_NE(err.find(newest), std::string::npos) << err;
  EXPECT_NE(err.find("truncated"), std::string::npos) << err;
}

TEST(Checkpoint, CorruptByteIsCaughtByCrc) {
  auto dir = dtorch::testing::scratch_dir("ckpt-crc");
  auto m = models::make_model("mnist-mlp");
  save_two(dir, *m);
  const std::string newest = checkpoint_path(dir, 2);
  flip_byte(newest, paths::file_size(newest) - 100);
  ::testing::internal::CaptureStderr();
  auto loaded = load_latest_checkpoint(dir, *m, nullptr);
  std::string err = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->data.epoch, 1);
  EXPECT_NE(err.find("CRC mismatch"), std::string::npos) << err;
  EXPECT_THROW(load_checkpoint(newest, *m, nullptr), CheckpointError);
}

TEST(Checkpoint, AllCorruptIsAnErrorNamingThem) {
  auto dir = dtorch::testing::scratch_dir("ckpt-all-bad");
  auto m = models::make_model("mnist-mlp");
  save_two(dir, *m);
  truncate_file(checkpoint_path(dir, 2), 10);
  flip_byte(checkpoint_path(dir, 1), 2);  // the magic number
  ::testing::internal::CaptureStderr();
  try {
    load_latest_checkpoint(dir, *m, nullptr);
    ::testing::internal::GetCapturedStderr();
    FAIL();
  } catch (const CheckpointError& e) {
    ::testing::internal::GetCapturedStderr();
    std::string msg = e.what();
    EXPECT_NE(msg.find("checkpoint-000002.dtc"), std::string::npos) << msg;
    EXPECT_NE(msg.find("checkpoint-000001.dtc"), std::string::npos) << msg;
    EXPECT_NE(msg.find("bad magic"), std::string::npos) << msg;
  }
}

TEST(Checkpoint, StrayTemporaryIsIgnored) {
  auto dir = dtorch::testing::scratch_dir("ckpt-stray");
  auto m = models::make_model("mnist-mlp");
  save_checkpoint(dir, {3, 30, "{}"}, *m, nullptr);
  std::ofstream(checkpoint_path(dir, 4) + ".12345.tmp") << "half a checkpoint";
  std::ofstream(dir + "/checkpoint-000005.dtc~") << "an editor's backup";
  EXPECT_EQ(names(list_checkpoints(dir)), "checkpoint-000003.dtc ");
  ::testing::internal::CaptureStderr();
  auto loaded = load_latest_checkpoint(dir, *m, nullptr);
  std::string err = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->data.epoch, 3);
  EXPECT_EQ(err.find("warning"), std::string::npos) << err;
}

TEST(Checkpoint, DifferentModelIsAClearError) {
  auto dir = dtorch::testing::scratch_dir("ckpt-other-model");
  auto mlp = models::make_model("mnist-mlp");
  save_checkpoint(dir, {1, 1, "{}"}, *mlp, nullptr);
  auto cnn = models::make_model("mnist-cnn");
  auto before = cnn->parameters()[0].clone();
  try {
    load_latest_checkpoint(dir, *cnn, nullptr);
    FAIL();
  } catch (const CheckpointError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("does not fit this model"), std::string::npos) << msg;
    EXPECT_NE(msg.find("checkpoint-000001.dtc"), std::string::npos) << msg;
  }
  EXPECT_TRUE(torch::equal(cnn->parameters()[0], before));
}

TEST(Checkpoint, DifferentOptimizerIsAClearError) {
  auto dir = dtorch::testing::scratch_dir("ckpt-other-optim");
  auto m = models::make_model("mnist-mlp");
  torch::optim::Adam adam(m->parameters(), torch::optim::AdamOptions(1e-3));
  train_steps(*m, adam, 1, 1);
  save_checkpoint(dir, {1, 1, "{}"}, *m, &adam);
  torch::optim::SGD sgd(m->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  try {
    load_latest_checkpoint(dir, *m, &sgd);
    FAIL();
  } catch (const CheckpointError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("written with optimizer torch::optim::Adam, this run uses "
                       "torch::optim::SGD"),
              std::string::npos)
        << msg;
  }
  // Same type, different parameter set: LibTorch's own check, reported as CheckpointError.
  torch::optim::Adam fewer(std::vector<torch::Tensor>{m->parameters()[0]},
                           torch::optim::AdamOptions(1e-3));
  EXPECT_THROW(load_latest_checkpoint(dir, *m, &fewer), CheckpointError);
}

TEST(Checkpoint, FailedSaveLeavesExistingCheckpointsIntact) {
  auto dir = dtorch::testing::scratch_dir("ckpt-failed-save");
  auto m = models::make_model("mnist-mlp");
  torch::Tensor first = m->parameters()[0].clone();
  save_checkpoint(dir, {1, 1, "{}"}, *m, nullptr);
  {
    torch::NoGradGuard g;
    m->parameters()[0].add_(1);
  }
  // Block the temporary's name so the write of epoch 1 (same file) and 2 fail midway.
  for (int e : {1, 2})
    paths::create_directory(checkpoint_path(dir, e) + "." + std::to_string(::getpid()) + ".tmp");
  EXPECT_THROW(save_checkpoint(dir, {1, 1, "{}"}, *m, nullptr), CheckpointError);
  EXPECT_THROW(save_checkpoint(dir, {2, 2, "{}"}, *m, nullptr), CheckpointError);
  auto fresh = models::make_model("mnist-mlp");
  auto loaded = load_latest_checkpoint(dir, *fresh, nullptr);
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->data.epoch, 1);
  EXPECT_TRUE(torch::equal(fresh->parameters()[0], first));
}

TEST(Checkpoint, PythonReadsThePayload) {
  DTORCH_SKIP_WITHOUT_PYTHON(/*need_peer=*/true);
  auto dir = dtorch::testing::scratch_dir("ckpt-python");
  auto m = models::make_model("mnist-mlp");
  save_checkpoint(dir, {4, 40, R"({"model":"mnist-mlp"})"}, *m, nullptr);
  std::string out;
  int rc = dtorch::testing::run_python(dir, "read", R"PY(
import io
raw = open("checkpoint-000004.dtc", "rb").read()
assert raw[:8] == b"DTORCHCK"
ck = torch.load(io.BytesIO(raw[24:]))
assert ck["epoch"] == 4 and ck["global_step"] == 40, ck
assert json.loads(ck["metadata"])["model"] == "mnist-mlp"
peer.MLP().load_state_dict(ck["model"], strict=True)
print("ok")
)PY",
                                       {}, &out);
  EXPECT_EQ(rc, 0) << out;
}

}  // namespace
}  // namespace dtorch::checkpoint
