// What an image model is built for. Apart from model.h so that a run's plain settings
// (train/config/) name it without LibTorch's module headers.
#pragma once

#include <cstdint>

namespace dtorch::models {

/// What an image model is built for: its input's channels and square side, and the number
/// of classes it tells apart. The default is Fashion-MNIST's; image data of other shapes
/// (--data cifar10:DIR, imagefolder:DIR) builds the model for its own. Language models
/// ignore it. Checkpoints record it (train/resume.cpp, config_json), so tools rebuild the same
/// model.
struct ImageInput {
  int64_t channels = 1;
  int64_t size = 28;
  int64_t classes = 10;
  bool operator==(const ImageInput& o) const {
    return channels == o.channels && size == o.size && classes == o.classes;
  }
};

}  // namespace dtorch::models
