// JPEG through libjpeg's setjmp error protocol, PNG through libpng's simplified API; both
// report into one DataError so callers see one kind of failure whatever the format.
#include "dtorch/data/image_decode.h"

// jpeglib.h needs size_t and FILE declared before it.
#include <jpeglib.h>
#include <png.h>
#include <cstddef>
#include <cstdio>

#include <algorithm>
#include <cctype>
#include <csetjmp>
#include <iterator>

#include "dtorch/core/error.h"
#include "dtorch/core/input_file.h"
#include "dtorch/core/paths.h"

namespace dtorch::data {
namespace {

// A header's size is checked before its pixels are allocated: a few bytes of JPEG can announce
// 65535 x 65535 pixels (12 GiB of RGB). 2^28 pixels (768 MiB) is far beyond any training image.
constexpr uint64_t kMaxPixels = uint64_t{1} << 28;

void check_pixels(uint64_t width, uint64_t height, const std::string& name) {
  DTORCH_CHECK_T(DataError, width * height <= kMaxPixels, name, ": announces ", width, "x", height,
                 " pixels, more than the ", kMaxPixels,
                 " dtorch decodes (a damaged file, or resize the image)");
}

// libjpeg calls error_exit on a fatal error and expects it not to return; we jump back to
// decode_jpeg with the message. Warnings (a truncated file: "Premature end of JPEG file",
// which libjpeg would otherwise pad with grey) are fatal too, as PIL's are.
struct JpegErrors {
  jpeg_error_mgr base;
  std::jmp_buf back;
  char message[JMSG_LENGTH_MAX] = {0};
};

void jpeg_fail(j_common_ptr info) {
  auto* e = reinterpret_cast<JpegErrors*>(info->err);
  (*info->err->format_message)(info, e->message);
  std::longjmp(e->back, 1);
}

void jpeg_warn(j_common_ptr info, int level) {
  if (level < 0) jpeg_fail(info);  // level -1: a warning about corrupt data
}

RgbImage decode_jpeg(const std::vector<uint8_t>& bytes, const std::string& name, int64_t min_side) {
  jpeg_decompress_struct info;
  JpegErrors errors;
  info.err = jpeg_std_error(&errors.base);
  errors.base.error_exit = jpeg_fail;
  errors.base.emit_message = jpeg_warn;
  RgbImage image;
  // Nothing with a destructor may be created between setjmp and the jump back.
  if (setjmp(errors.back)) {
    jpeg_destroy_decompress(&info);
    DTORCH_FAIL(DataError, name, ": not a readable JPEG image (", errors.message, ")");
  }
  jpeg_create_decompress(&info);
  jpeg_mem_src(&info, bytes.data(), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&info, TRUE);
  if (static_cast<uint64_t>(info.image_width) * info.image_height > kMaxPixels) {
    const uint64_t width = info.image_width, height = info.image_height;
    jpeg_destroy_decompress(&info);
    check_pixels(width, height, name);
  }
  info.out_color_space = JCS_RGB;  // libjpeg converts grey and YCbCr; CMYK fails above
  info.scale_num = 8;
  info.scale_denom = 8;
  const int64_t shorter = std::min<int64_t>(info.image_width, info.image_height);
  if (min_side > 0) {
    while (info.scale_num > 1 && shorter * (info.scale_num - 1) / 8 >= min_side)
      --info.scale_num;
  }
  jpeg_start_decompress(&info);
  image.width = info.output_width;
  image.height = info.output_height;
  image.pixels.resize(static_cast<size_t>(image.width * image.height * 3));
  while (info.output_scanline < info.output_height) {
    JSAMPROW row = image.pixels.data() +
                   static_cast<size_t>(info.output_scanline) * static_cast<size_t>(image.width) * 3;
    jpeg_read_scanlines(&info, &row, 1);
  }
  jpeg_finish_decompress(&info);
  jpeg_destroy_decompress(&info);
  return image;
}

RgbImage decode_png(const std::vector<uint8_t>& bytes, const std::string& name) {
  png_image png{};
  png.version = PNG_IMAGE_VERSION;
  auto failed = [&](const char* when) {
    const std::string why = png.message;
    png_image_free(&png);
    DTORCH_FAIL(DataError, name, ": not a readable PNG image (", why.empty() ? when : why, ")");
  };
  if (!png_image_begin_read_from_memory(&png, bytes.data(), bytes.size())) failed("header");
  if (static_cast<uint64_t>(png.width) * png.height > kMaxPixels) {
    png_image_free(&png);
    check_pixels(png.width, png.height, name);
  }
  // Composited onto black when it has alpha, like PIL's convert("RGB") drops alpha.
  png.format = PNG_FORMAT_RGB;
  RgbImage image;
  image.width = png.width;
  image.height = png.height;
  image.pixels.resize(PNG_IMAGE_SIZE(png));
  if (!png_image_finish_read(&png, nullptr, image.pixels.data(), 0, nullptr)) failed("pixels");
  png_image_free(&png);
  return image;
}

}  // namespace

RgbImage decode_image(const std::vector<uint8_t>& bytes, const std::string& name,
                      int64_t min_side) {
  DTORCH_CHECK_T(DataError, !bytes.empty(), name, ": the file is empty");
  if (bytes.size() >= 3 && bytes[0] == 0xFF && bytes[1] == 0xD8 && bytes[2] == 0xFF)
    return decode_jpeg(bytes, name, min_side);
  static const uint8_t kPng[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (bytes.size() >= sizeof kPng && std::equal(std::begin(kPng), std::end(kPng), bytes.begin()))
    return decode_png(bytes, name);
  DTORCH_FAIL(DataError, name, ": neither a JPEG nor a PNG image (its first bytes say so); ",
              "convert it, or move it out of the data folder");
}

RgbImage decode_image_file(const std::string& path, int64_t min_side) {
  // No photograph is a gigabyte: a larger file is something else, refused before it is read.
  const std::string text = read_input_file<DataError>(path, "image", uint64_t{1} << 30);
  return decode_image(std::vector<uint8_t>(text.begin(), text.end()), path, min_side);
}

bool is_image_file(const std::string& path) {
  std::string ext = paths::extension(path);
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png";
}

}  // namespace dtorch::data
