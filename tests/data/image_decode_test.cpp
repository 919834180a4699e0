// Decoding: PNG exactly, JPEG closely, libjpeg's DCT scaling, and every failure naming the
// file and the reason.
#include "dtorch/data/image_decode.h"

#include <gtest/gtest.h>

#include <zlib.h>

#include <fstream>

#include "dtorch/core/error.h"
#include "support/image_files.h"
#include "support/workers.h"

namespace dtorch::data {
namespace {

RgbImage gradient(int64_t w, int64_t h) {
  RgbImage im;
  im.width = w;
  im.height = h;
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x) {
      im.pixels.push_back(static_cast<uint8_t>(x * 255 / std::max<int64_t>(1, w - 1)));
      im.pixels.push_back(static_cast<uint8_t>(y * 255 / std::max<int64_t>(1, h - 1)));
      im.pixels.push_back(static_cast<uint8_t>((x + y) % 256));
    }
  return im;
}

double mean_abs_diff(const RgbImage& a, const RgbImage& b) {
  double sum = 0;
  for (size_t i = 0; i < a.pixels.size(); ++i)
    sum += std::abs(int(a.pixels[i]) - int(b.pixels[i]));
  return sum / static_cast<double>(a.pixels.size());
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string message_of(const std::string& path) {
  try {
    decode_image_file(path);
  } catch (const DataError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ImageDecode, PngRoundTripsExactlyInRgbAndGrey) {
  const std::string dir = testing::scratch_dir("decode-png");
  const RgbImage im = gradient(37, 19);
  testing::write_png(dir + "/rgb.png", im);
  const RgbImage back = decode_image_file(dir + "/rgb.png");
  EXPECT_EQ(back.width, 37);
  EXPECT_EQ(back.height, 19);
  EXPECT_EQ(back.pixels, im.pixels);
  testing::write_png(dir + "/grey.png", im, /*grey=*/true);
  const RgbImage grey = decode_image_file(dir + "/grey.png");
  for (size_t p = 0; p < grey.pixels.size(); p += 3) {  // R repeated in all three channels
    ASSERT_EQ(grey.pixels[p], im.pixels[p]);
    ASSERT_EQ(grey.pixels[p + 1], im.pixels[p]);
    ASSERT_EQ(grey.pixels[p + 2], im.pixels[p]);
  }
}

TEST(ImageDecode, JpegDecodesCloseToTheOriginal) {
  const std::string dir = testing::scratch_dir("decode-jpeg");
  const RgbImage im = gradient(64, 48);
  testing::write_jpeg(dir + "/a.JPG", im, 95);
  const RgbImage back = decode_image_file(dir + "/a.JPG");
  ASSERT_EQ(back.width, 64);
  ASSERT_EQ(back.height, 48);
  EXPECT_LT(mean_abs_diff(back, im), 4.0);
}

TEST(ImageDecode, JpegDecodesAtTheSmallestScaleCoveringTheSide) {
  const std::string dir = testing::scratch_dir("decode-scale");
  testing::write_jpeg(dir + "/big.jpg", gradient(256, 192));
  // Shorter side 192: 3/8 gives 72 >= 64 and 2/8 gives 48 < 64.
  RgbImage s = decode_image_file(dir + "/big.jpg", 64);
  EXPECT_EQ(s.height, 72);
  EXPECT_EQ(s.width, 96);
  s = decode_image_file(dir + "/big.jpg", 24);  // 1/8: 24
  EXPECT_EQ(s.height, 24);
  s = decode_image_file(dir + "/big.jpg", 500);  // never enlarges: full size
  EXPECT_EQ(s.height, 192);
  s = decode_image_file(dir + "/big.jpg");
  EXPECT_EQ(s.width, 256);
}

TEST(ImageDecode, FailuresNameTheFileAndTheReason) {
  const std::string dir = testing::scratch_dir("decode-bad");
  testing::write_jpeg(dir + "/whole.jpg", gradient(64, 64));
  std::ifstream in(dir + "/whole.jpg", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  write_bytes(dir + "/truncated.jpg", bytes.substr(0, bytes.size() / 2));
  std::string m = message_of(dir + "/truncated.jpg");
  EXPECT_TRUE(m.find(dir + "/truncated.jpg") != std::string::npos) << m;
  EXPECT_TRUE(m.find("JPEG") != std::string::npos) << m;

  testing::write_png(dir + "/whole.png", gradient(64, 64));
  std::ifstream pin(dir + "/whole.png", std::ios::binary);
  std::string png((std::istreambuf_iterator<char>(pin)), std::istreambuf_iterator<char>());
  write_bytes(dir + "/truncated.png", png.substr(0, png.size() / 2));
  m = message_of(dir + "/truncated.png");
  EXPECT_TRUE(m.find("truncated.png: not a readable PNG image") != std::string::npos) << m;

  write_bytes(dir + "/text.png", "hello, not an image");
  m = message_of(dir + "/text.png");
  EXPECT_TRUE(m.find("neither a JPEG nor a PNG") != std::string::npos) << m;
  write_bytes(dir + "/empty.jpg", "");
  EXPECT_TRUE(message_of(dir + "/empty.jpg").find("empty") != std::string::npos);
  EXPECT_TRUE(message_of(dir + "/missing.jpg").find("no such file") != std::string::npos);

  // A header announcing 65535 x 65535 pixels is refused before 12 GiB are allocated.
  std::string huge_png = png;
  for (const size_t at : {16, 20})
    huge_png.replace(at, 4, "\x00\x00\xff\xff", 4);  // IHDR's width and height
  const uint32_t crc =
      static_cast<uint32_t>(::crc32(0, reinterpret_cast<const Bytef*>(huge_png.data() + 12), 17));
  for (int k = 0; k < 4; ++k)
    huge_png[29 + k] = static_cast<char>(crc >> (24 - 8 * k));
  write_bytes(dir + "/huge.png", huge_png);
  EXPECT_NE(message_of(dir + "/huge.png").find("huge.png: announces 65535x65535 pixels"),
            std::string::npos)
      << message_of(dir + "/huge.png");
  std::string huge_jpg = bytes;
  const size_t sof = huge_jpg.find("\xff\xc0");
  ASSERT_NE(sof, std::string::npos);
  // SOF0's height and width (libjpeg itself refuses sides above 65500)
  huge_jpg.replace(sof + 5, 4, "\xea\x60\xea\x60", 4);
  write_bytes(dir + "/huge.jpg", huge_jpg);
  EXPECT_NE(message_of(dir + "/huge.jpg").find("huge.jpg: announces 60000x60000 pixels"),
            std::string::npos)
      << message_of(dir + "/huge.jpg");
}

TEST(ImageDecode, KnowsImageExtensions) {
  EXPECT_TRUE(is_image_file("a/b.jpg"));
  EXPECT_TRUE(is_image_file("a/b.JPEG"));
  EXPECT_TRUE(is_image_file("b.Png"));
  EXPECT_FALSE(is_image_file("b.gif"));
  EXPECT_FALSE(is_image_file("jpg"));
}

}  // namespace
}  // namespace dtorch::data
