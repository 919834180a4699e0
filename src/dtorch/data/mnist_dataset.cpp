// Loads MNIST-format splits from IDX files and normalises them exactly as the Python peer
// does (same float32 operations in the same order), so C++ and Python see identical inputs.
#include "dtorch/data/mnist_dataset.h"

#include "dtorch/core/error.h"
#include "dtorch/core/paths.h"
#include "dtorch/data/idx.h"

namespace dtorch::data {
namespace {

constexpr int64_t kSide = 28;
constexpr int64_t kClasses = 10;

std::string install_hint() {
  return str("install Fashion-MNIST with `apt-get install dataset-fashion-mnist` (it goes to ",
             kDefaultMnistDir,
             "), or pass --data-dir DIR naming a folder with the MNIST-format files "
             "train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz], t10k-...");
}

std::string prefix_of(const std::string& split) {
  DTORCH_CHECK_T(ConfigError, split == "train" || split == "test", "unknown dataset split '", split,
                 "': use \"train\" or \"test\"");
  return split == "train" ? "train" : "t10k";
}

}  // namespace

std::string mnist_file(const std::string& dir, const std::string& split, const std::string& kind) {
  DTORCH_CHECK_T(ConfigError, kind == "images" || kind == "labels", "unknown MNIST file kind '",
                 kind, "': use \"images\" or \"labels\"");
  const std::string base = paths::join(
      dir, prefix_of(split) + "-" + kind + "-idx" + (kind == "images" ? "3" : "1") + "-ubyte");
  if (!paths::exists(base + ".gz") && paths::exists(base)) return base;
  return base + ".gz";
}

MnistSplit load_mnist(const std::string& dir, const std::string& split, int64_t max_samples) {
  DTORCH_CHECK_T(DataError, paths::is_directory(dir), "dataset directory ", dir,
                 " does not exist: ", install_hint());
  const std::string images_path = mnist_file(dir, split, "images");
  const std::string labels_path = mnist_file(dir, split, "labels");
  for (const auto& p : {images_path, labels_path}) {
    DTORCH_CHECK_T(DataError, paths::exists(p), "dataset file ", p, " (or the same without .gz)",
                   " not found: ", install_hint());
  }

  const int64_t max_items = max_samples > 0 ? max_samples : -1;
  int64_t images_in_file = 0, labels_in_file = 0;
  torch::Tensor pixels = read_idx(images_path, max_items, &images_in_file);
  torch::Tensor labels = read_idx(labels_path, max_items, &labels_in_file);
  DTORCH_CHECK_T(DataError, pixels.dim() == 3 && pixels.size(1) == kSide && pixels.size(2) == kSide,
                 "dataset file ", images_path, " holds data shaped ", pixels.sizes(),
                 ", expected N x 28 x 28 images: is it an MNIST-format images file?");
  DTORCH_CHECK_T(DataError, labels.dim() == 1, "dataset file ", labels_path, " holds data shaped ",
                 labels.sizes(), ", expected N labels: is it an MNIST-format labels file?");
  DTORCH_CHECK_T(DataError, images_in_file == labels_in_file,
                 "dataset files disagree: ", images_path, " holds ", images_in_file, " images but ",
                 labels_path, " holds ", labels_in_file,
                 " labels; they must come from the same dataset and split");
  if (labels.numel() > 0) {
    const int64_t max_label = labels.max().item<int64_t>();
    DTORCH_CHECK_T(DataError, max_label < kClasses, "dataset file ", labels_path, " holds label ",
                   max_label, ", expected classes 0..", kClasses - 1);
  }

  // The peer computes float32(x) / 255 (numpy), then (x - mean) / std (torch, scalar double
  // operands applied in float32). The same three operations in the same order give the same
  // bits here.
  MnistSplit out;
  out.images = pixels.to(torch::kFloat32)
                   .div_(255.0)
                   .sub_(kFashionMnistMean)
                   .div_(kFashionMnistStd)
                   .unsqueeze_(1);
  out.labels = labels.to(torch::kInt64);
  return out;
}

Batch gather(const MnistSplit& data, const std::vector<int64_t>& indices) {
  torch::Tensor idx = torch::tensor(indices, torch::kInt64);
  return {data.images.index_select(0, idx), data.labels.index_select(0, idx)};
}

}  // namespace dtorch::data
