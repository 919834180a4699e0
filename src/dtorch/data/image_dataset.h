// Image datasets of the user's own: a folder with one sub-folder per class (torchvision's
// ImageFolder layout) or the CIFAR-10 binary files. Files are decoded when a batch needs
// them (data/prefetch.h runs that ahead of training); only paths and labels stay in memory,
// except CIFAR-10's 180 MB, which is read whole.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dtorch/core/enum_names.h"
#include "dtorch/data/image_decode.h"
#include "dtorch/data/image_transform.h"

namespace dtorch::data {

/// The samples of one split: how many, each one's class and pixels.
class ImageSource {
 public:
  virtual ~ImageSource() = default;
  virtual int64_t size() const = 0;
  virtual int64_t label(int64_t i) const = 0;
  /// Sample i's pixels (decode_image's `min_side`). Throws DataError naming the sample.
  virtual RgbImage load(int64_t i, int64_t min_side) const = 0;
  /// What names sample i in messages: its file, or file and record.
  virtual std::string name(int64_t i) const = 0;
};

/// A dataset's two splits and its class names (index = label).
struct ImageSplits {
  std::vector<std::string> classes;
  std::shared_ptr<const ImageSource> train, test;
  /// Channel statistics for normalisation and the side images have without resizing (0:
  /// they vary).
  std::array<float, 3> mean{}, std{};
  int64_t natural_size = 0;
  std::string describe;  ///< where the splits came from, for the log
};

/// Note [Image folder splits]: DIR/train and DIR/val (or DIR/test), each with one sub-folder
/// per class, are the two splits (ImageNet's layout); otherwise DIR's own sub-folders are the
/// classes and every tenth file of each class (in name order: the 10th, 20th, ...) is held
/// out for testing. Classes are the sub-folder names in sorted order, files are .jpg, .jpeg
/// or .png (any case) in name order, hidden ones skipped, as torchvision's ImageFolder
/// does. Throws DataError when DIR is missing, has fewer than two classes, a class has no
/// image, or the test split names a class training lacks.
ImageSplits scan_image_folder(const std::string& dir);

/// CIFAR-10's binary version (cifar-10-batches-bin): data_batch_1.bin .. data_batch_5.bin for
/// training, test_batch.bin for testing, records of one label byte and 3 x 32 x 32 pixel
/// bytes (channel-major). A DIR holding a cifar-10-batches-bin folder is accepted too.
/// Throws DataError naming the file when one is missing, has a partial record or a label
/// outside 0..9.
ImageSplits load_cifar10(const std::string& dir);

/// What to do with a sample that cannot be decoded: fail | skip.
enum class BadImages { Fail, Skip };
const NameTable<BadImages>& names(BadImages);

/// How samples become a batch.
struct ImageBatchOptions {
  ImageTransform transform;
  uint64_t seed = 0;  ///< with the epoch and sample index, the augmentation's (sample_seed)
  BadImages bad = BadImages::Fail;
};

/// A batch: float B x 3 x S x S images, int64 B labels, and the samples left out.
struct ImageBatch {
  torch::Tensor images;
  torch::Tensor labels;
  std::vector<std::string> skipped;  ///< "NAME: REASON" of each sample left out
};

/// Decodes, transforms and stacks the samples at `indices` for `epoch`. A sample that fails
/// to decode throws its DataError (with the hint to use --bad-images skip) under
/// BadImages::Fail; under Skip it is left out, named in `skipped` and warned about once per
/// process, and a batch left empty throws (nothing to train on).
ImageBatch image_batch(const ImageSource& source, const std::vector<int64_t>& indices,
                       const ImageBatchOptions& options, int64_t epoch);

}  // namespace dtorch::data
