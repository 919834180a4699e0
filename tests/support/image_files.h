// Image files for tests, written with the same libraries the loader reads them with:
// Fashion-MNIST as class folders of PNG or JPEG files, corrupt files, CIFAR-10 records.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dtorch/data/image_decode.h"

namespace dtorch::testing {

/// Writes `image` as an 8-bit PNG, grey (the R channel) when `grey`.
void write_png(const std::string& path, const data::RgbImage& image, bool grey = false);
/// Writes `image` as a baseline JPEG of the given quality.
void write_jpeg(const std::string& path, const data::RgbImage& image, int quality = 95);

/// Whether Debian's Fashion-MNIST is installed (the image folders below are made from it).
bool have_fashion_mnist();

/// Fashion-MNIST training image `i` (Debian's copy) as a grey RgbImage, and its label.
data::RgbImage fashion_image(int64_t i, int64_t* label = nullptr);

/// An image folder DIR/<label>-<name>/NNNNN.<ext> (sorted class names follow the labels)
/// holding the first `per_class` Fashion-MNIST training images of every class, alternately
/// PNG and JPEG when `ext` is "mixed". Returns the index of each file's image, by path.
std::vector<std::pair<std::string, int64_t>> write_fashion_folder(const std::string& dir,
                                                                  int64_t per_class,
                                                                  const std::string& ext);

/// A CIFAR-10 batch file: per record the label byte, then 1024 red, 1024 green and 1024 blue
/// bytes; byte p of channel c of record r is pixel(r, c, p).
void write_cifar(const std::string& path, const std::vector<uint8_t>& labels,
                 const std::function<uint8_t(int r, int c, int p)>& pixel);

}  // namespace dtorch::testing

/// Skips the current test when Fashion-MNIST is not installed.
#define DTORCH_SKIP_WITHOUT_FASHION()           \
  if (!::dtorch::testing::have_fashion_mnist()) \
  GTEST_SKIP() << "no Fashion-MNIST (apt-get install dataset-fashion-mnist)"
