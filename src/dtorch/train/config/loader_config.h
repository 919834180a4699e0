// What `dtorch train` may name as --data, and how it makes its batches: loader threads, the
// image size, augmentation and what an unreadable image does. A plain struct that a run's
// configuration holds and the data (train/train_data.h) follows, and the checks of both.
#pragma once

#include <cstdint>
#include <string>

#include "dtorch/core/enum_names.h"
#include "dtorch/data/image_dataset.h"

namespace dtorch::train {
inline namespace config {

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

bool is_text_data(const std::string& data);
bool is_image_data(const std::string& data);  ///< cifar10:DIR or imagefolder:DIR

/// Throws ConfigError for a --data the trainer does not know, one that does not fit the model
/// (`language_model`: the model takes tokens) and loader flags that do not fit the data.
void validate_data(const std::string& data, const LoaderConfig& loader, bool language_model);

}  // namespace config
}  // namespace dtorch::train
