// Pictures: the PNG holds the drawn pixels (read back with zlib's inflate here, and with Python's
// PIL), the SVG every shape with its text escaped, and bad paths are refused without leaving
// files behind.
#include "dtorch/core/picture.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <fstream>

#include "dtorch/core/bitmap_font.h"
#include "dtorch/core/error.h"
#include "dtorch/core/paths.h"
#include "models/python_peer.h"
#include "support/command.h"
#include "support/workers.h"

namespace dtorch {
namespace {

uint32_t be32(const std::string& s, size_t at) {
  uint32_t v = 0;
  for (int k = 0; k < 4; ++k)
    v = (v << 8) | static_cast<unsigned char>(s[at + k]);
  return v;
}

// A minimal PNG reader for what Picture::png writes: checks every chunk's CRC and returns the
// RGB bytes, row after row.
std::vector<uint8_t> decode_png(const std::string& png, int* width, int* height) {
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n"));
  std::string idat;
  for (size_t at = 8; at < png.size();) {
    const uint32_t n = be32(png, at);
    const std::string type = png.substr(at + 4, 4), data = png.substr(at + 8, n);
    const std::string body = type + data;
    EXPECT_EQ(be32(png, at + 8 + n),
              ::crc32(0, reinterpret_cast<const Bytef*>(body.data()), body.size()))
        << type;
    if (type == "IHDR") {
      *width = be32(data, 0), *height = be32(data, 4);
      EXPECT_EQ(data[8], 8);  // bit depth
      EXPECT_EQ(data[9], 2);  // RGB
    }
    if (type == "IDAT") idat += data;
    at += 12 + n;
  }
  std::vector<uint8_t> raw(size_t(*height) * (*width * 3 + 1));
  uLongf size = raw.size();
  EXPECT_EQ(uncompress(raw.data(), &size, reinterpret_cast<const Bytef*>(idat.data()), idat.size()),
            Z_OK);
  EXPECT_EQ(size, raw.size());
  std::vector<uint8_t> rgb;
  for (int y = 0; y < *height; ++y) {
    EXPECT_EQ(raw[size_t(y) * (*width * 3 + 1)], 0) << "row " << y << " filter";
    auto row = raw.begin() + size_t(y) * (*width * 3 + 1) + 1;
    rgb.insert(rgb.end(), row, row + *width * 3);
  }
  return rgb;
}

Picture sample() {
  Picture p(60, 40, Color::hex("#ffffff"));
  p.box(2, 3, 10, 8, Color::hex("#6baed6"), Color::hex("#333333"));
  p.line({{20, 30}, {50, 30}}, Color::hex("#ff0000"), 2);
  p.text(30, 15, "A<&", 11, Color::hex("#000000"));
  return p;
}

TEST(Picture, PngHoldsTheDrawnPixels) {
  int w = 0, h = 0;
  auto rgb = decode_png(sample().png(), &w, &h);
  ASSERT_EQ(w, 60);
  ASSERT_EQ(h, 40);
  auto at = [&](int x, int y) {
    const uint8_t* p = &rgb[(size_t(y) * w + x) * 3];
    return Color{p[0], p[1], p[2]};
  };
  EXPECT_EQ(at(0, 0).hex(), "#ffffff");
  EXPECT_EQ(at(6, 7).hex(), "#6baed6");  // inside the box
  EXPECT_EQ(at(2, 3).hex(), "#333333");  // its outline, on the box's first and last pixels
  EXPECT_EQ(at(11, 10).hex(), "#333333");
  EXPECT_EQ(at(12, 7).hex(), "#ffffff");  // just outside
  // The line covers pixel rows 29 and 30 (its centre runs along y = 30) and nothing at 27.
  EXPECT_EQ(at(35, 29).hex(), "#ff0000");
  EXPECT_EQ(at(35, 30).hex(), "#ff0000");
  EXPECT_EQ(at(35, 27).hex(), "#ffffff");
  // 'A' is the font's glyph with its baseline at y = 15: every set bit black, the others white.
  const uint8_t* a = font::glyph('A');
  int set = 0;
  for (int gy = 0; gy < font::kHeight; ++gy) {
    for (int gx = 0; gx < font::kWidth; ++gx) {
      const bool on = a[gy] & (0x80 >> gx);
      set += on;
      EXPECT_EQ(at(30 + gx, 15 - font::kAscent + gy).hex(), on ? "#000000" : "#ffffff")
          << gx << "," << gy;
    }
  }
  EXPECT_GT(set, 10);
}

TEST(Picture, SvgHoldsEveryShapeWithItsTextEscaped) {
  const std::string svg = sample().svg();
  EXPECT_NE(svg.find("width=\"60\" height=\"40\""), std::string::npos) << svg;
  EXPECT_NE(svg.find("<rect x=\"2\" y=\"3\" width=\"10\" height=\"8\" fill=\"#6baed6\" "
                     "stroke=\"#333333\"/>"),
            std::string::npos)
      << svg;
  EXPECT_NE(svg.find("points=\"20,30 50,30\""), std::string::npos) << svg;
  EXPECT_NE(svg.find(">A&lt;&amp;</text>"), std::string::npos) << svg;
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
}

TEST(Picture, BadColoursPathsAndSizesAreNamed) {
  EXPECT_THROW(Color::hex("red"), ConfigError);
  EXPECT_THROW(Picture(0, 10), ConfigError);
  const std::string dir = testing::scratch_dir("picture_bad");
  try {
    write_picture(sample(), dir + "/x.jpg");
    ADD_FAILURE() << "a .jpg was written";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(".png or .svg"), std::string::npos) << e.what();
  }
  EXPECT_THROW(write_picture(sample(), dir + "/no/such/dir/x.png"), ConfigError);
  // A file in place stays whole until the new one is complete; no temporary is left.
  write_picture(sample(), dir + "/x.svg");
  write_picture(sample(), dir + "/x.png");
  EXPECT_EQ(testing::read_file(dir + "/x.png"), sample().png());
  for (const std::string& name : paths::list_directory(dir))
    EXPECT_EQ(paths::extension(name), name == "x.svg" ? ".svg" : ".png")
        << "a temporary was left: " << dir << "/" << name;
}

TEST(Picture, PythonPilReadsThePng) {
  DTORCH_SKIP_WITHOUT_PYTHON(false);
  const std::string dir = testing::scratch_dir("picture_pil");
  write_picture(sample(), dir + "/x.png");
  std::string out;
  int rc =
      testing::run_python(dir, "read_png",
                          "import sys\n"
                          "try:\n"
                          "    from PIL import Image\n"
                          "except ImportError:\n"
                          "    print('SKIP no PIL'); sys.exit(0)\n"
                          "im = Image.open(sys.argv[2])\n"
                          "print(im.size, im.mode, im.getpixel((6, 7)), im.getpixel((35, 30)))\n",
                          {dir + "/x.png"}, &out);
  ASSERT_EQ(rc, 0) << out;
  if (testing::contains(out, "SKIP")) GTEST_SKIP() << out;
  EXPECT_TRUE(testing::contains(out, "(60, 40) RGB (107, 174, 214) (255, 0, 0)")) << out;
}

}  // namespace
}  // namespace dtorch
