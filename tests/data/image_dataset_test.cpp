// Image folders and CIFAR-10: the classes and splits found, labels and shapes of batches,
// pixels equal to the files' (Fashion-MNIST written as PNG), determinism per seed, disjoint
// shards per rank, unreadable images failed or skipped by name.
#include "dtorch/data/image_dataset.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <map>
#include <numeric>
#include <set>
#include <sstream>

#include "dtorch/core/error.h"
#include "dtorch/core/paths.h"
#include "dtorch/data/mnist_dataset.h"
#include "dtorch/data/sampler.h"
#include "models/python_peer.h"
#include "support/error_of.h"
#include "support/image_files.h"
#include "support/workers.h"

namespace dtorch::data {
namespace {

ImageBatchOptions plain(int64_t size) {
  ImageBatchOptions o;
  o.transform.size = size;
  o.transform.mean = {0, 0, 0};
  o.transform.std = {1, 1, 1};
  return o;
}

TEST(ImageFolder, ClassesLabelsAndHeldOutTenth) {
  DTORCH_SKIP_WITHOUT_FASHION();
  const std::string dir = testing::scratch_dir("imagefolder-scan");
  auto files = testing::write_fashion_folder(dir, 20, "mixed");
  paths::create_directories(dir + "/.cache/x");  // hidden: not a class
  ImageSplits s = scan_image_folder(dir);
  ASSERT_EQ(s.classes.size(), 10u);
  EXPECT_EQ(s.classes[0], "0-tshirt");
  EXPECT_EQ(s.classes[9], "9-boot");
  EXPECT_EQ(s.train->size(), 180);  // 18 of 20 per class
  EXPECT_EQ(s.test->size(), 20);
  for (int64_t i = 0; i < s.train->size(); ++i) {
    const std::string name = s.train->name(i);
    const auto folder = paths::file_name(paths::parent_path(name));
    ASSERT_EQ(s.train->label(i), std::stoi(folder)) << name;
  }
}

TEST(ImageFolder, PngPixelsEqualTheDatasetsAndLabelsFollowFolders) {
  DTORCH_SKIP_WITHOUT_FASHION();
  const std::string dir = testing::scratch_dir("imagefolder-pixels");
  auto files = testing::write_fashion_folder(dir, 10, "png");
  ImageSplits s = scan_image_folder(dir);
  std::map<std::string, int64_t> image_of(files.begin(), files.end());
  std::vector<int64_t> all(static_cast<size_t>(s.train->size()));
  std::iota(all.begin(), all.end(), 0);
  ImageBatch b = image_batch(*s.train, all, plain(28), 0);
  ASSERT_EQ(b.images.sizes(), (std::vector<int64_t>{s.train->size(), 3, 28, 28}));
  ASSERT_EQ(b.labels.size(0), s.train->size());
  for (int64_t i = 0; i < s.train->size(); ++i) {
    int64_t label = 0;
    RgbImage want = testing::fashion_image(image_of.at(s.train->name(i)), &label);
    ASSERT_EQ(b.labels[i].item<int64_t>(), label);
    auto got = (b.images[i][1] * 255).round().to(torch::kUInt8).reshape({-1});
    for (int64_t p = 0; p < 28 * 28; ++p)
      ASSERT_EQ(got[p].item<int>(), want.pixels[static_cast<size_t>(p * 3)]) << s.train->name(i);
  }
}

TEST(ImageFolder, TrainAndValFoldersAreTheSplits) {
  DTORCH_SKIP_WITHOUT_FASHION();
  const std::string dir = testing::scratch_dir("imagefolder-trainval");
  testing::write_fashion_folder(dir + "/train", 3, "jpg");
  testing::write_fashion_folder(dir + "/val", 1, "png");
  ImageSplits s = scan_image_folder(dir);
  EXPECT_EQ(s.classes.size(), 10u);
  EXPECT_EQ(s.train->size(), 30);
  EXPECT_EQ(s.test->size(), 10);
  ImageBatch b = image_batch(*s.test, {0, 9}, plain(16), 0);
  EXPECT_EQ(b.images.sizes(), (std::vector<int64_t>{2, 3, 16, 16}));
  EXPECT_EQ(b.labels[0].item<int64_t>(), 0);
  EXPECT_EQ(b.labels[1].item<int64_t>(), 9);
  paths::create_directories(dir + "/val/zebra");
  EXPECT_NE(testing::error_of<DataError>([&] {
              scan_image_folder(dir);
            }).find("val/zebra is a class the training"),
            std::string::npos);
}

TEST(ImageFolder, BadLayoutsSayWhatToDo) {
  const std::string dir = testing::scratch_dir("imagefolder-bad");
  EXPECT_NE(testing::error_of<DataError>([&] {
              scan_image_folder(dir + "/nope");
            }).find("does not exist"),
            std::string::npos);
  paths::create_directories(dir + "/only");
  EXPECT_NE(testing::error_of<DataError>([&] { scan_image_folder(dir); }).find("1 class folder(s)"),
            std::string::npos);
  paths::create_directories(dir + "/other");
  std::ofstream(dir + "/other/readme.txt") << "x";
  EXPECT_NE(testing::error_of<DataError>([&] {
              scan_image_folder(dir);
            }).find("holds no .jpg, .jpeg or .png"),
            std::string::npos);
}

TEST(ImageFolder, AugmentedBatchesAreFixedBySeedAndEpoch) {
  DTORCH_SKIP_WITHOUT_FASHION();
  const std::string dir = testing::scratch_dir("imagefolder-seed");
  testing::write_fashion_folder(dir, 10, "mixed");
  ImageSplits s = scan_image_folder(dir);
  ImageBatchOptions o = plain(28);
  o.transform.augment = true;
  o.seed = 5;
  const std::vector<int64_t> idx{3, 1, 4, 15, 9, 26};
  auto a = image_batch(*s.train, idx, o, 2);
  auto b = image_batch(*s.train, idx, o, 2);
  EXPECT_TRUE(torch::equal(a.images, b.images));
  EXPECT_FALSE(torch::equal(a.images, image_batch(*s.train, idx, o, 3).images));
  o.seed = 6;
  EXPECT_FALSE(torch::equal(a.images, image_batch(*s.train, idx, o, 2).images));
  EXPECT_TRUE(torch::equal(a.labels, b.labels));
}

TEST(ImageFolder, RanksGetDisjointShards) {
  DTORCH_SKIP_WITHOUT_FASHION();
  const std::string dir = testing::scratch_dir("imagefolder-shards");
  testing::write_fashion_folder(dir, 10, "png");
  ImageSplits s = scan_image_folder(dir);  // 90 training images: 3 ranks x 30
  std::set<std::string> seen;
  for (int rank = 0; rank < 3; ++rank) {
    DistributedSampler sampler(s.train->size(), rank, 3, 11);
    sampler.set_epoch(1);
    for (int64_t i : sampler.indices())
      ASSERT_TRUE(seen.insert(s.train->name(i)).second) << "two ranks got " << s.train->name(i);
  }
  EXPECT_EQ(static_cast<int64_t>(seen.size()), s.train->size());
}

TEST(ImageFolder, UnreadableImagesFailOrAreSkippedByName) {
  DTORCH_SKIP_WITHOUT_FASHION();
  const std::string dir = testing::scratch_dir("imagefolder-unreadable");
  testing::write_fashion_folder(dir, 10, "png");
  const std::string bad = dir + "/3-dress/00000-broken.png";
  std::ofstream(bad) << "not a png";
  ImageSplits s = scan_image_folder(dir);
  int64_t bad_index = -1;
  for (int64_t i = 0; i < s.train->size(); ++i)
    if (s.train->name(i) == bad) bad_index = i;
  ASSERT_GE(bad_index, 0);
  ImageBatchOptions o = plain(28);
  const std::string m = testing::error_of<DataError>([&] {
    image_batch(*s.train, {0, bad_index}, o, 0);
  });
  EXPECT_NE(m.find(bad), std::string::npos) << m;
  EXPECT_NE(m.find("--bad-images skip"), std::string::npos) << m;
  o.bad = BadImages::Skip;
  ImageBatch b = image_batch(*s.train, {0, bad_index, 1}, o, 0);
  EXPECT_EQ(b.images.size(0), 2);
  EXPECT_EQ(b.labels.size(0), 2);
  ASSERT_EQ(b.skipped.size(), 1u);
  EXPECT_NE(b.skipped[0].find(bad), std::string::npos);
  EXPECT_NE(testing::error_of<DataError>([&] {
              image_batch(*s.train, {bad_index}, o, 0);
            }).find("every image"),
            std::string::npos);
}

// CIFAR-10 records whose bytes say where they are.
void write_cifar(const std::string& path, const std::vector<uint8_t>& labels) {
  testing::write_cifar(path, labels, [](int r, int c, int p) {
    return static_cast<uint8_t>((p + 50 * c + 7 * r) % 256);
  });
}

TEST(Cifar10, ReadsRecordsChannelMajor) {
  const std::string dir = testing::scratch_dir("cifar") + "/cifar-10-batches-bin";
  paths::create_directories(dir);
  for (int b = 1; b <= 5; ++b)
    write_cifar(dir + "/data_batch_" + std::to_string(b) + ".bin", {uint8_t(b), uint8_t(9)});
  write_cifar(dir + "/test_batch.bin", {0, 1, 2});
  ImageSplits s = load_cifar10(paths::parent_path(dir));
  EXPECT_EQ(s.train->size(), 10);
  EXPECT_EQ(s.test->size(), 3);
  EXPECT_EQ(s.classes[3], "cat");
  EXPECT_EQ(s.natural_size, 32);
  EXPECT_EQ(s.train->name(3), "data_batch_2.bin record 1");
  ImageBatch b = image_batch(*s.train, {2, 3}, plain(32), 0);
  EXPECT_EQ(b.labels[0].item<int64_t>(), 2);
  EXPECT_EQ(b.labels[1].item<int64_t>(), 9);
  for (int c = 0; c < 3; ++c)
    for (int p : {0, 33, 1023}) {
      const int want = (p + 50 * c + 7 * 0) % 256;  // record 0 of data_batch_2
      ASSERT_EQ(std::lround(b.images[0][c][p / 32][p % 32].item<float>() * 255), want);
    }
}

TEST(Cifar10, BadFilesAreNamed) {
  const std::string dir = testing::scratch_dir("cifar-bad");
  EXPECT_NE(testing::error_of<DataError>([&] {
              load_cifar10(dir);
            }).find("data_batch_1.bin: no such file; --data cifar10:DIR expects"),
            std::string::npos);
  for (int b = 1; b <= 5; ++b)
    write_cifar(dir + "/data_batch_" + std::to_string(b) + ".bin", {1});
  write_cifar(dir + "/test_batch.bin", {12});
  EXPECT_NE(testing::error_of<DataError>([&] {
              load_cifar10(dir);
            }).find("test_batch.bin record 0 has label 12"),
            std::string::npos);
  std::ofstream(dir + "/data_batch_3.bin", std::ios::app) << "xyz";
  EXPECT_NE(testing::error_of<DataError>([&] {
              load_cifar10(dir);
            }).find("not a whole number of 3073-byte"),
            std::string::npos);
}

}  // namespace
}  // namespace dtorch::data

namespace dtorch::data {
namespace {

// torchvision's ImageFolder on the same folder: the same classes, every file with the same
// label, and PIL's decoding of each JPEG and PNG within a grey level of ours.
TEST(ImageFolderTorchvision, SameClassesLabelsAndPixels) {
  DTORCH_SKIP_WITHOUT_FASHION();
  DTORCH_SKIP_WITHOUT_PYTHON(false);
  const std::string dir = testing::scratch_dir("imagefolder-torchvision");
  testing::write_fashion_folder(dir + "/data", 10, "mixed");
  std::string output;
  const int rc = testing::run_python(dir, "folder", R"(
import sys, json
import numpy as np
from torchvision import datasets
d = datasets.ImageFolder(sys.argv[2])
print("CLASSES " + json.dumps(d.classes))
for path, label in d.samples:
    px = np.asarray(d.loader(path), dtype=np.uint8)
    print("SAMPLE %s %d %s" % (path, label, ",".join(str(v) for v in px.reshape(-1))))
)",
                                     {dir + "/data"}, &output);
  ASSERT_EQ(rc, 0) << output;
  ImageSplits s = scan_image_folder(dir + "/data");
  std::map<std::string, int64_t> ours;
  for (const auto* split : {s.train.get(), s.test.get()})
    for (int64_t i = 0; i < split->size(); ++i)
      ours[split->name(i)] = split->label(i);
  std::istringstream lines(output);
  int64_t samples = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("CLASSES ", 0) == 0) {
      EXPECT_EQ(nlohmann::json::parse(line.substr(8)).get<std::vector<std::string>>(), s.classes);
    }
    if (line.rfind("SAMPLE ", 0) != 0) continue;
    std::istringstream f(line.substr(7));
    std::string path, pixels;
    int64_t label = 0;
    f >> path >> label >> pixels;
    ASSERT_TRUE(ours.count(path)) << path << " is not in dtorch's splits";
    EXPECT_EQ(ours[path], label) << path;
    const RgbImage im = decode_image_file(path);
    std::istringstream values(pixels);
    int max_diff = 0;
    size_t n = 0;
    for (std::string v; std::getline(values, v, ','); ++n)
      max_diff = std::max(max_diff, std::abs(std::stoi(v) - int(im.pixels.at(n))));
    EXPECT_EQ(n, im.pixels.size()) << path;
    EXPECT_LE(max_diff, 1) << path;
    ++samples;
  }
  EXPECT_EQ(samples, static_cast<int64_t>(ours.size()));
}

}  // namespace
}  // namespace dtorch::data
