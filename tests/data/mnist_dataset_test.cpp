// Tests for MNIST-format loading: file naming, normalisation, the errors that say how to get
// the data, the real Debian Fashion-MNIST test split, and bit-equality with the peer's loader.
#include "dtorch/data/mnist_dataset.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "data/idx_writer.h"
#include "dtorch/core/error.h"
#include "dtorch/core/paths.h"
#include "models/python_peer.h"
#include "support/error_of.h"
#include "support/workers.h"

namespace dtorch::data {
namespace {

using dtorch::testing::idx_bytes;
using dtorch::testing::pattern;

// Writes a split of n samples; images raw or gzipped, labels the other way round.
void write_split(const std::string& dir, const std::string& prefix, uint32_t n_images,
                 uint32_t n_labels, bool gz_images, uint32_t side = 28) {
  auto images = idx_bytes({n_images, side, side}, pattern(n_images * side * side));
  std::vector<uint8_t> labels(n_labels);
  for (uint32_t i = 0; i < n_labels; ++i)
    labels[i] = static_cast<uint8_t>(i % 10);
  auto label_bytes = idx_bytes({n_labels}, labels);
  const std::string ip = dir + "/" + prefix + "-images-idx3-ubyte";
  const std::string lp = dir + "/" + prefix + "-labels-idx1-ubyte";
  if (gz_images) {
    dtorch::testing::write_gzip(ip + ".gz", images);
    dtorch::testing::write_bytes(lp, label_bytes);
  } else {
    dtorch::testing::write_bytes(ip, images);
    dtorch::testing::write_gzip(lp + ".gz", label_bytes);
  }
}

std::string error_of(const std::string& dir, const std::string& split) {
  return testing::error_of<DataError>([&] { load_mnist(dir, split); });
}

TEST(DataMnist, LoadsSmallSplitsNormalisedLikeThePeer) {
  auto dir = dtorch::testing::scratch_dir("mnist-small");
  write_split(dir, "train", 5, 5, /*gz_images=*/false);
  write_split(dir, "t10k", 3, 3, /*gz_images=*/true);
  MnistSplit train = load_mnist(dir, "train");
  ASSERT_EQ(train.size(), 5);
  EXPECT_EQ(train.images.sizes(), (std::vector<int64_t>{5, 1, 28, 28}));
  EXPECT_EQ(train.images.scalar_type(), torch::kFloat32);
  EXPECT_EQ(train.labels.scalar_type(), torch::kInt64);
  EXPECT_TRUE(torch::equal(train.labels, torch::arange(5, torch::kInt64)));
  // Pixel values mapped through ((p / 255) - mean) / std in float32.
  auto raw = pattern(5 * 28 * 28);
  auto flat = train.images.flatten();
  for (int i : {0, 1, 783, 784, 3919}) {
    float expected = (static_cast<float>(raw[i]) / 255.0f - 0.2860f) / 0.3530f;
    EXPECT_NEAR(flat[i].item<float>(), expected, 1e-6) << i;
  }
  EXPECT_EQ(load_mnist(dir, "test").size(), 3);
}

TEST(DataMnist, PrefersGzButReadsRawFiles) {
  auto dir = dtorch::testing::scratch_dir("mnist-names");
  write_split(dir, "train", 2, 2, false);
  EXPECT_EQ(mnist_file(dir, "train", "images"), dir + "/train-images-idx3-ubyte");
  EXPECT_EQ(mnist_file(dir, "train", "labels"), dir + "/train-labels-idx1-ubyte.gz");
  EXPECT_EQ(mnist_file(dir, "test", "labels"), dir + "/t10k-labels-idx1-ubyte.gz");
  EXPECT_THROW(mnist_file(dir, "valid", "labels"), ConfigError);
  EXPECT_THROW(load_mnist(dir, "validation"), ConfigError);
}

TEST(DataMnist, CountMismatchNamesBothFiles) {
  auto dir = dtorch::testing::scratch_dir("mnist-mismatch");
  write_split(dir, "train", 4, 5, true);
  std::string msg = error_of(dir, "train");
  EXPECT_NE(msg.find("train-images-idx3-ubyte.gz"), std::string::npos) << msg;
  EXPECT_NE(msg.find("train-labels-idx1-ubyte"), std::string::npos) << msg;
  EXPECT_NE(msg.find("4 images"), std::string::npos) << msg;
  EXPECT_NE(msg.find("5 labels"), std::string::npos) << msg;
}

// A run on the first N samples loads those: the whole split's first N, bit for bit; files
// whose counts disagree are refused all the same.
TEST(DataMnist, LoadsTheFirstSamplesOfASplit) {
  auto dir = dtorch::testing::scratch_dir("mnist-first");
  write_split(dir, "train", 6, 6, /*gz_images=*/true);
  const MnistSplit whole = load_mnist(dir, "train");
  const MnistSplit first = load_mnist(dir, "train", 4);
  ASSERT_EQ(first.size(), 4);
  EXPECT_TRUE(torch::equal(first.images, whole.images.slice(0, 0, 4)));
  EXPECT_TRUE(torch::equal(first.labels, whole.labels.slice(0, 0, 4)));
  EXPECT_EQ(load_mnist(dir, "train", 60).size(), 6);

  write_split(dir, "t10k", 4, 5, /*gz_images=*/false);
  const std::string msg = testing::error_of<DataError>([&] { load_mnist(dir, "test", 2); });
  EXPECT_NE(msg.find("4 images"), std::string::npos) << msg;
  EXPECT_NE(msg.find("5 labels"), std::string::npos) << msg;
}

TEST(DataMnist, MissingDataSaysHowToGetIt) {
  auto dir = dtorch::testing::scratch_dir("mnist-missing");
  for (const std::string& msg : {error_of(dir + "/absent", "train"), error_of(dir, "test")}) {
    EXPECT_NE(msg.find("apt-get install dataset-fashion-mnist"), std::string::npos) << msg;
    EXPECT_NE(msg.find("--data-dir"), std::string::npos) << msg;
  }
  // Images present, labels missing: the message names the labels file.
  write_split(dir, "train", 2, 2, true);
  paths::remove(dir + "/train-labels-idx1-ubyte");
  std::string msg = error_of(dir, "train");
  EXPECT_NE(msg.find("train-labels-idx1-ubyte.gz"), std::string::npos) << msg;
}

TEST(DataMnist, RejectsWrongShapesAndLabels) {
  auto dir = dtorch::testing::scratch_dir("mnist-shapes");
  write_split(dir, "train", 2, 2, false, /*side=*/32);
  EXPECT_NE(error_of(dir, "train").find("expected N x 28 x 28"), std::string::npos);
  write_split(dir, "t10k", 2, 2, false);
  dtorch::testing::write_gzip(dir + "/t10k-labels-idx1-ubyte.gz", idx_bytes({2}, {3, 12}));
  std::string msg = error_of(dir, "test");
  EXPECT_NE(msg.find("label 12"), std::string::npos) << msg;
}

TEST(DataMnist, GatherPicksSamples) {
  auto dir = dtorch::testing::scratch_dir("mnist-gather");
  write_split(dir, "train", 6, 6, true);
  MnistSplit d = load_mnist(dir, "train");
  Batch b = gather(d, {5, 0, 5});
  EXPECT_EQ(b.images.sizes(), (std::vector<int64_t>{3, 1, 28, 28}));
  EXPECT_TRUE(torch::equal(b.labels, torch::tensor({5, 0, 5}, torch::kInt64)));
  EXPECT_TRUE(torch::equal(b.images[1], d.images[0]));
}

TEST(DataMnist, RealDebianTestSplit) {
  if (!paths::exists(std::string(kDefaultMnistDir) + "/t10k-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "no Fashion-MNIST (apt-get install dataset-fashion-mnist)";
  MnistSplit test = load_mnist(kDefaultMnistDir, "test");
  ASSERT_EQ(test.size(), 10000);
  EXPECT_EQ(test.images.sizes(), (std::vector<int64_t>{10000, 1, 28, 28}));
  EXPECT_EQ(test.labels.min().item<int64_t>(), 0);
  EXPECT_EQ(test.labels.max().item<int64_t>(), 9);
  // Fashion-MNIST's test split is balanced: 1000 of each class.
  EXPECT_TRUE(torch::equal(torch::bincount(test.labels), torch::full({10}, 1000, torch::kInt64)));
  // Normalised with the training statistics: mean near 0, std near 1.
  EXPECT_NEAR(test.images.mean().item<double>(), 0.0, 0.02);
  EXPECT_NEAR(test.images.std().item<double>(), 1.0, 0.02);
}

TEST(DataMnist, BitIdenticalToPeerLoader) {
  DTORCH_SKIP_WITHOUT_PYTHON(/*need_peer=*/true);
  if (!paths::exists(std::string(kDefaultMnistDir) + "/t10k-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "no Fashion-MNIST (apt-get install dataset-fashion-mnist)";
  auto dir = dtorch::testing::scratch_dir("mnist-peer");
  std::string out;
  int rc = dtorch::testing::run_python(dir, "peer_load", R"PY(
x, y = peer.load("test")
torch.save({"x": x[:500].clone(), "y": y[:500].clone()}, "peer.pt")
)PY",
                                       {}, &out);
  ASSERT_EQ(rc, 0) << out;
  std::ifstream in(dir + "/peer.pt", std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
  auto dict = torch::pickle_load(bytes).toGenericDict();
  MnistSplit test = load_mnist(kDefaultMnistDir, "test");
  torch::Tensor px = dict.at("x").toTensor(), py = dict.at("y").toTensor();
  EXPECT_TRUE(torch::equal(test.images.slice(0, 0, 500), px))
      << "max diff " << (test.images.slice(0, 0, 500) - px).abs().max().item<float>();
  EXPECT_TRUE(torch::equal(test.labels.slice(0, 0, 500), py));
}

}  // namespace
}  // namespace dtorch::data
