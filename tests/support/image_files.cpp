// Encoders the loader never needs: only tests write images.
#include "support/image_files.h"

#include <jpeglib.h>
#include <png.h>
#include <cstddef>
#include <cstdio>

#include <fstream>
#include <map>
#include <stdexcept>

#include "dtorch/core/paths.h"
#include "dtorch/data/mnist_dataset.h"

namespace dtorch::testing {

void write_png(const std::string& path, const data::RgbImage& image, bool grey) {
  png_image png{};
  png.version = PNG_IMAGE_VERSION;
  png.width = static_cast<png_uint_32>(image.width);
  png.height = static_cast<png_uint_32>(image.height);
  png.format = grey ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  std::vector<uint8_t> pixels;
  if (grey) {
    for (size_t i = 0; i < image.pixels.size(); i += 3)
      pixels.push_back(image.pixels[i]);
  } else {
    pixels = image.pixels;
  }
  if (!png_image_write_to_file(&png, path.c_str(), 0, pixels.data(), 0, nullptr))
    throw std::runtime_error("cannot write " + path + ": " + png.message);
}

void write_jpeg(const std::string& path, const data::RgbImage& image, int quality) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw std::runtime_error("cannot write " + path);
  jpeg_compress_struct info;
  jpeg_error_mgr errors;
  info.err = jpeg_std_error(&errors);
  jpeg_create_compress(&info);
  jpeg_stdio_dest(&info, f);
  info.image_width = static_cast<JDIMENSION>(image.width);
  info.image_height = static_cast<JDIMENSION>(image.height);
  info.input_components = 3;
  info.in_color_space = JCS_RGB;
  jpeg_set_defaults(&info);
  jpeg_set_quality(&info, quality, TRUE);
  jpeg_start_compress(&info, TRUE);
  while (info.next_scanline < info.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(image.pixels.data()) +
                   static_cast<size_t>(info.next_scanline) * static_cast<size_t>(image.width) * 3;
    jpeg_write_scanlines(&info, &row, 1);
  }
  jpeg_finish_compress(&info);
  jpeg_destroy_compress(&info);
  std::fclose(f);
}

namespace {

const data::MnistSplit& fashion_train() {
  static const data::MnistSplit split = [] {
    auto s = data::load_mnist(data::kDefaultMnistDir, "train");
    // Back to the file's bytes: load_mnist normalised them.
    s.images = ((s.images * data::kFashionMnistStd + data::kFashionMnistMean) * 255)
                   .round()
                   .clamp(0, 255)
                   .to(torch::kUInt8);
    return s;
  }();
  return split;
}

}  // namespace

bool have_fashion_mnist() {
  return paths::exists(data::mnist_file(data::kDefaultMnistDir, "train", "images"));
}

void write_cifar(const std::string& path, const std::vector<uint8_t>& labels,
                 const std::function<uint8_t(int r, int c, int p)>& pixel) {
  std::ofstream f(path, std::ios::binary);
  for (std::size_t r = 0; r < labels.size(); ++r) {
    f.put(static_cast<char>(labels[r]));
    for (int c = 0; c < 3; ++c)
      for (int p = 0; p < 1024; ++p)
        f.put(static_cast<char>(pixel(static_cast<int>(r), c, p)));
  }
}

data::RgbImage fashion_image(int64_t i, int64_t* label) {
  const auto& s = fashion_train();
  auto px = s.images[i].reshape({28 * 28}).contiguous();
  data::RgbImage image;
  image.width = image.height = 28;
  for (int64_t p = 0; p < 28 * 28; ++p)
    for (int c = 0; c < 3; ++c)
      image.pixels.push_back(px.data_ptr<uint8_t>()[p]);
  if (label) *label = s.labels[i].item<int64_t>();
  return image;
}

std::vector<std::pair<std::string, int64_t>> write_fashion_folder(const std::string& dir,
                                                                  int64_t per_class,
                                                                  const std::string& ext) {
  static const char* kNames[] = {"tshirt", "trouser", "pullover", "dress", "coat",
                                 "sandal", "shirt",   "sneaker",  "bag",   "boot"};
  std::map<int64_t, int64_t> written;
  std::vector<std::pair<std::string, int64_t>> files;
  for (int64_t i = 0; static_cast<int64_t>(files.size()) < per_class * 10; ++i) {
    int64_t label = 0;
    data::RgbImage image = fashion_image(i, &label);
    if (written[label] >= per_class) continue;
    const std::string folder = dir + "/" + std::to_string(label) + "-" + kNames[label];
    paths::create_directories(folder);
    const bool png = ext == "png" || (ext == "mixed" && written[label] % 2 == 0);
    char name[32];
    std::snprintf(name, sizeof name, "/%05lld.%s", static_cast<long long>(i), png ? "png" : "jpg");
    if (png) {
      write_png(folder + name, image, /*grey=*/true);
    } else {
      write_jpeg(folder + name, image);
    }
    files.emplace_back(folder + name, i);
    ++written[label];
  }
  return files;
}

}  // namespace dtorch::testing
