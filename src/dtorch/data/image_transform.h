// What happens to a decoded image on its way into a batch: resized and cropped to the model's
// input, augmented for training, normalised. Pure functions of the pixels and a seed, so a
// sample looks the same whichever loader thread or rank prepares it.
#pragma once

#include <array>
#include <cstdint>

#include "dtorch/data/image_decode.h"

namespace dtorch::data {

/// torchvision's Resize(size) + CenterCrop(size), then for training RandomCrop(size,
/// padding=pad) + RandomHorizontalFlip(), then ToTensor() + Normalize(mean, std).
struct ImageTransform {
  int64_t size = 32;     ///< output side: the model's input
  bool augment = false;  ///< random crop with padding and horizontal flip
  int64_t pad = 4;       ///< zero (black) border the random crop may reach into
  std::array<float, 3> mean{0.5f, 0.5f, 0.5f};  ///< per channel, of pixel / 255
  std::array<float, 3> std{0.5f, 0.5f, 0.5f};
};

/// ImageNet's channel statistics, which torchvision's pretrained models and tutorials use
/// for photos of any kind.
inline constexpr std::array<float, 3> kImageNetMean{0.485f, 0.456f, 0.406f};
inline constexpr std::array<float, 3> kImageNetStd{0.229f, 0.224f, 0.225f};
/// CIFAR-10's training-set channel statistics.
inline constexpr std::array<float, 3> kCifar10Mean{0.4914f, 0.4822f, 0.4465f};
inline constexpr std::array<float, 3> kCifar10Std{0.2470f, 0.2435f, 0.2616f};

/// Resizes `in` so its shorter side is `side` (bilinear with an antialiasing support that
/// widens with the reduction, as PIL's resize does; a no-op at that size already), keeping
/// the aspect ratio.
RgbImage resize_shorter_side(const RgbImage& in, int64_t side);

/// `t` applied to `in`, written as float 3 x t.size x t.size (channel-major) into `out`.
/// The augmentation's choices (crop offset, flip) come from `seed` alone: give each sample of
/// each epoch its own (sample_seed).
void transform_image(const RgbImage& in, const ImageTransform& t, uint64_t seed, float* out);

/// A seed per (run seed, epoch, sample index), well mixed (splitmix64).
uint64_t sample_seed(uint64_t seed, int64_t epoch, int64_t index);

}  // namespace dtorch::data
