// JPEG and PNG files decoded into 8-bit RGB pixels with Debian's libjpeg-turbo and libpng: the
// loader's only contact with image formats, so every failure names the file and the reason.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dtorch::data {

/// Pixels in row-major order, height x width x 3 (R, G, B), as PIL's convert("RGB") gives them:
/// grey images repeat their value in all three, alpha is dropped, 16-bit samples are cut to 8.
struct RgbImage {
  int64_t width = 0;
  int64_t height = 0;
  std::vector<uint8_t> pixels;
};

/// Decodes the JPEG or PNG image in `bytes` (the format is told by its first bytes, not by
/// `name`, which only labels errors). A JPEG is decoded at the smallest of libjpeg's scales
/// 1/8, 2/8, ..., 8/8 whose shorter side is still at least `min_side` (0: full size): the
/// DCT skips the detail a later downscale would throw away, which is most of the work for
/// photos much larger than the model's input. Throws DataError "NAME: REASON" for an empty,
/// truncated or corrupt file and for any other format.
RgbImage decode_image(const std::vector<uint8_t>& bytes, const std::string& name,
                      int64_t min_side = 0);

/// Reads and decodes the file at `path` (DataError names it when it cannot be read).
RgbImage decode_image_file(const std::string& path, int64_t min_side = 0);

/// Whether `path`'s extension is one the decoder reads: .jpg, .jpeg, .png (any case).
bool is_image_file(const std::string& path);

}  // namespace dtorch::data
