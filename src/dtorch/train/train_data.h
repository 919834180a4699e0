// What `dtorch train` trains on: --data names MNIST-format files, CIFAR-10, an image folder or
// a text, and this file turns each into the same two splits of (inputs, targets) batches.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "dtorch/data/image_dataset.h"
#include "dtorch/models/model.h"

namespace dtorch::train {

/// auto | crop-flip | none (--augment).
enum class Augment { Auto, CropFlip, None };
const NameTable<Augment>& names(Augment);

/// How batches are made: by how many threads, and what image data goes through.
struct LoaderConfig {
  /// Threads that build the next batches while the current one trains (0: the training
  /// thread builds each batch when it needs it). Note [Prefetching loader].
  int workers = 0;
  /// Side of the square images the model takes (0: the data's own: 28 for MNIST, 32 for
  /// CIFAR-10; 32 for image folders, whose images vary).
  int64_t image_size = 0;
  /// Random crop with padding and horizontal flip for training (auto: crop-flip for cifar10
  /// and image folders, none for MNIST, which the peer does not augment).
  Augment augment = Augment::Auto;
  /// What an unreadable image does (image folders).
  data::BadImages bad_images = data::BadImages::Fail;
};

/// One split: `size` samples (images or text windows) and the batch of inputs and targets
/// for any list of sample indices in a given epoch (augmentation differs per epoch). batch
/// may be called from several threads at once.
struct Split {
  int64_t size = 0;
  std::function<std::pair<torch::Tensor, torch::Tensor>(const std::vector<int64_t>&, int64_t)>
      batch;
};

struct TrainData {
  Split train, test;
  models::ImageInput input;  ///< what an image model is to be built for
  std::string describe;      ///< for the log: what was read from where
};

bool is_text_data(const std::string& data);
bool is_image_data(const std::string& data);  ///< cifar10:DIR or imagefolder:DIR

/// Throws ConfigError for a --data the trainer does not know, one that does not fit the model
/// (`language_model`: the model takes tokens) and loader flags that do not fit the data.
void validate_data(const std::string& data, const LoaderConfig& loader, bool language_model);

/// Reads `data` (MNIST from `mnist_dir`, empty: Debian's folder), and for image data decides
/// the model's input; a text is only read by add_text_windows, once the model's sequence
/// length is known. `seed` makes the augmentation's choices.
TrainData open_data(const std::string& data, const std::string& mnist_dir,
                    const LoaderConfig& loader, uint64_t seed);

/// Fills `d`'s splits with windows of `seq_len` tokens of the text `data` names.
void add_text_windows(TrainData& d, const std::string& data, int64_t seq_len);

}  // namespace dtorch::train
