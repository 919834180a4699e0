// MNIST-format datasets (Fashion-MNIST, MNIST) loaded whole into memory as tensors, with the
// normalisation the Python peer uses, so both sides train on bit-identical inputs.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace dtorch::data {

/// Where Debian's dataset-fashion-mnist package installs Fashion-MNIST.
inline constexpr const char* kDefaultMnistDir = "/usr/share/datasets/fashion-mnist";
/// Fashion-MNIST pixel mean and standard deviation (of pixel/255), as in the peer.
inline constexpr double kFashionMnistMean = 0.2860;
inline constexpr double kFashionMnistStd = 0.3530;

/// One split of an MNIST-format dataset.
struct MnistSplit {
  /// float32, N x 1 x 28 x 28, normalised as ((pixel / 255) - mean) / std.
  torch::Tensor images;
  /// int64, N, class indices 0..9.
  torch::Tensor labels;

  int64_t size() const { return labels.defined() ? labels.size(0) : 0; }
};

/// A mini-batch gathered from a split.
struct Batch {
  torch::Tensor images;  ///< float32, B x 1 x 28 x 28
  torch::Tensor labels;  ///< int64, B
};

/// Path of a split's images or labels file in `dir` (kind "images" or "labels"), preferring
/// the .gz file and falling back to the raw one; when neither exists, the .gz path.
std::string mnist_file(const std::string& dir, const std::string& split, const std::string& kind);

/// Loads split "train" (train-*-ubyte[.gz]) or "test" (t10k-*-ubyte[.gz]) from `dir`.
/// Throws DataError when the directory or a file is missing (naming
/// `apt-get install dataset-fashion-mnist` and --data-dir), when a file is malformed, when
/// images are not 28x28, when labels are outside 0..9, and when the image and label counts
/// disagree (naming both files). Throws ConfigError for any other split name.
/// `max_samples` > 0 loads only the first that many samples (read_idx's `max_items`); the
/// counts the two files announce must still agree.
MnistSplit load_mnist(const std::string& dir, const std::string& split, int64_t max_samples = 0);

/// The samples at `indices` (any order, repeats allowed) as one batch.
Batch gather(const MnistSplit& data, const std::vector<int64_t>& indices);

}  // namespace dtorch::data
