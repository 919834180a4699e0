// `dtorch train` on the user's own images: an image folder on two ranks with loader threads,
// CIFAR-10 files into a model built for them, and unreadable images stopping the run by name
// or skipped.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>

#include "dtorch/data/mnist_dataset.h"
#include "support/command.h"
#include "support/image_files.h"
#include "support/train_run.h"
#include "support/workers.h"

namespace dtorch {
namespace {

using testing::contains;
using testing::run_command;

std::vector<std::string> image_args(const std::string& data, const std::string& out) {
  return {DTORCH_CLI, "train",    "--model", "mnist-cnn",  "--data", data,     "--out",
          out,        "--epochs", "2",       "--progress", "off",    "--seed", "3"};
}

TEST(TrainCli, ImageFolderTrainsOnTwoRanksWithLoaderThreads) {
  DTORCH_SKIP_WITHOUT_FASHION();
  const std::string dir = testing::scratch_dir("train_imagefolder");
  testing::write_fashion_folder(dir + "/images", 60, "mixed");
  auto args = image_args("imagefolder:" + dir + "/images", dir + "/run");
  // (--lr 0.05 lost its first epoch's accuracy in the second on LibTorch 1.13's kernels.)
  args.insert(args.end(), {"--image-size", "28", "--nproc-per-node", "2", "--data-workers", "2",
                           "--batch-size", "16", "--lr", "0.02"});
  auto r = run_command("train_imagefolder_cmd", args, 300);
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_TRUE(contains(r.err, "540 training and 60 test images, 10 classes, 28x28")) << r.err;
  auto epochs = testing::epochs_of(dir + "/run");
  ASSERT_EQ(epochs.size(), 2u);
  EXPECT_GT(epochs[1]["test_accuracy"].get<double>(), 0.4);  // chance: 0.1
  auto model = testing::model_file(dir + "/run/model.pt");
  EXPECT_EQ(model.at("conv1.weight").sizes(), (std::vector<int64_t>{32, 3, 3, 3}));
}

// CIFAR-10 records whose class is the image's brightness, so a model can learn it.
void write_cifar(const std::string& path, int records, int offset) {
  std::vector<uint8_t> labels;
  for (int r = 0; r < records; ++r)
    labels.push_back(static_cast<uint8_t>((r + offset) % 10));
  testing::write_cifar(path, labels, [&](int r, int c, int p) {
    return static_cast<uint8_t>(labels[static_cast<std::size_t>(r)] * 25 +
                                ((c * 1024 + p) * 13 + r) % 7);
  });
}

TEST(TrainCli, Cifar10BuildsTheModelForItsImages) {
  const std::string dir = testing::scratch_dir("train_cifar10");
  for (int b = 1; b <= 5; ++b)
    write_cifar(dir + "/data_batch_" + std::to_string(b) + ".bin", 40, b);
  write_cifar(dir + "/test_batch.bin", 50, 0);
  auto args = image_args("cifar10:" + dir, dir + "/run");
  args.insert(args.end(), {"--batch-size", "20", "--data-workers", "1"});
  auto r = run_command("train_cifar10_cmd", args, 300);
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_TRUE(contains(r.err, "200 training and 50 test images, 10 classes, 32x32")) << r.err;
  auto model = testing::model_file(dir + "/run/model.pt");
  EXPECT_EQ(model.at("conv1.weight").sizes(), (std::vector<int64_t>{32, 3, 3, 3}));
  EXPECT_EQ(model.at("fc1.weight").size(1), 64 * 14 * 14);  // (32 - 4) / 2 = 14
  EXPECT_EQ(testing::epochs_of(dir + "/run").size(), 2u);
}

TEST(TrainCli, UnreadableImageStopsTheRunByNameOrIsSkipped) {
  DTORCH_SKIP_WITHOUT_FASHION();
  const std::string dir = testing::scratch_dir("train_bad_image");
  testing::write_fashion_folder(dir + "/images", 10, "png");
  const std::string bad = dir + "/images/4-coat/00000-cut.jpg";
  std::ofstream(bad) << "\xFF\xD8\xFF\xE0 truncated";
  auto args = image_args("imagefolder:" + dir + "/images", dir + "/run");
  args.insert(args.end(), {"--nproc-per-node", "2", "--data-workers", "2", "--batch-size", "8"});
  auto r = run_command("train_bad_image_cmd", args, 120);
  EXPECT_NE(r.exit_code(), 0);
  EXPECT_TRUE(contains(r.err, bad + ": not a readable JPEG image")) << r.err;
  EXPECT_TRUE(contains(r.err, "--bad-images skip")) << r.err;
  EXPECT_LT(r.seconds, 60);
  args.insert(args.end(), {"--bad-images", "skip"});
  r = run_command("train_skip_image_cmd", args, 120);
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_TRUE(contains(r.err, "skipping " + bad)) << r.err;
}

TEST(TrainCli, LoaderFlagsThatDoNotFitTheDataAreRefused) {
  const std::string dir = testing::scratch_dir("train_loader_flags");
  struct Case {
    std::string data;
    std::vector<std::string> extra;
    std::string says;
  } cases[] = {
      {"fashion-mnist", {"--image-size", "32"}, "MNIST images are 28x28"},
      {"fashion-mnist", {"--augment", "crop-flip"}, "--augment crop-flip applies to"},
      {"imagefolder:", {}, "names no folder"},
      {"imagefolder:" + dir + "/none", {}, "does not exist"},
      {"cifar10:" + dir, {}, "data_batch_1.bin: no such file"},
      {"fashion-mnist", {"--data-workers", "-1"}, "--data-workers -1"},
      {"cifar10:" + dir, {"--model", "gpt-debug"}, "use --data text"},
  };
  for (const auto& c : cases) {
    auto args = image_args(c.data, dir + "/run");
    if (c.extra.size() == 2 && c.extra[0] == "--model") args[3] = c.extra[1];
    if (c.extra.empty() || c.extra[0] != "--model")
      args.insert(args.end(), c.extra.begin(), c.extra.end());
    auto r = run_command("train_loader_flags_cmd", args, 60);
    EXPECT_NE(r.exit_code(), 0) << c.says;
    EXPECT_TRUE(contains(r.err, c.says)) << c.says << "\n" << r.err;
  }
}

}  // namespace
}  // namespace dtorch
