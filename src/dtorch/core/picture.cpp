// Renders a Picture as SVG text or as PNG pixels (Note [Two renderings of one picture]).
#include "dtorch/core/picture.h"

#include "dtorch/core/atomic_file.h"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "dtorch/core/bitmap_font.h"
#include "dtorch/core/error.h"

namespace dtorch {

Color Color::hex(const std::string& rgb) {
  DTORCH_CHECK_T(ConfigError,
                 rgb.size() == 7 && rgb[0] == '#' &&
                     rgb.find_first_not_of("0123456789abcdefABCDEF", 1) == std::string::npos,
                 "colour '", rgb, "' is not of the form #rrggbb");
  auto byte = [&](int i) { return static_cast<uint8_t>(std::stoi(rgb.substr(i, 2), nullptr, 16)); };
  return {byte(1), byte(3), byte(5)};
}

std::string Color::hex() const {
  char s[8];
  std::snprintf(s, sizeof s, "#%02x%02x%02x", r, g, b);
  return s;
}

Picture::Picture(int width, int height, Color background)
    : width_(width), height_(height), background_(background) {
  DTORCH_CHECK_T(ConfigError, width > 0 && height > 0 && width <= 20000 && height <= 20000,
                 "a picture of ", width, " x ", height, " pixels is out of range (1 .. 20000)");
}

void Picture::box(double x, double y, double w, double h, Color fill,
                  std::optional<Color> outline) {
  Shape s{Shape::Box, {{x, y}, {w, h}}, fill};
  s.outline = outline;
  shapes_.push_back(std::move(s));
}

void Picture::line(std::vector<std::pair<double, double>> points, Color color, double width) {
  if (points.size() < 2) return;
  Shape s{Shape::Line, std::move(points), color};
  s.size = width;
  shapes_.push_back(std::move(s));
}

void Picture::text(double x, double y, std::string s, double size, Color color, Anchor anchor) {
  Shape t{Shape::Text, {{x, y}}, color};
  t.size = size;
  t.text = std::move(s);
  t.anchor = anchor;
  shapes_.push_back(std::move(t));
}

namespace {

int text_scale(double size) {
  return size >= 18 ? 2 : 1;
}

std::string escaped(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// The pixels of a picture being rasterised, blending colours by coverage.
struct Canvas {
  int w, h;
  std::vector<uint8_t> rgb;

  Canvas(int w, int h, Color bg) : w(w), h(h), rgb(size_t(w) * h * 3) {
    for (size_t i = 0; i < rgb.size(); i += 3)
      rgb[i] = bg.r, rgb[i + 1] = bg.g, rgb[i + 2] = bg.b;
  }
  void blend(int x, int y, Color c, double alpha) {
    if (x < 0 || y < 0 || x >= w || y >= h || alpha <= 0) return;
    alpha = std::min(alpha, 1.0);
    uint8_t* p = &rgb[(size_t(y) * w + x) * 3];
    const uint8_t v[3] = {c.r, c.g, c.b};
    for (int k = 0; k < 3; ++k)
      p[k] = static_cast<uint8_t>(std::lround(p[k] * (1 - alpha) + v[k] * alpha));
  }
  void fill(int x0, int y0, int x1, int y1, Color c) {  // [x0, x1) x [y0, y1)
    for (int y = std::max(y0, 0); y < std::min(y1, h); ++y)
      for (int x = std::max(x0, 0); x < std::min(x1, w); ++x)
        blend(x, y, c, 1);
  }
  // A segment `width` wide: each pixel is covered by how far its centre lies inside.
  void segment(double ax, double ay, double bx, double by, Color c, double width) {
    const double r = width / 2, pad = r + 1;
    const int x0 = std::floor(std::min(ax, bx) - pad), x1 = std::ceil(std::max(ax, bx) + pad);
    const int y0 = std::floor(std::min(ay, by) - pad), y1 = std::ceil(std::max(ay, by) + pad);
    const double dx = bx - ax, dy = by - ay, len2 = dx * dx + dy * dy;
    for (int y = std::max(y0, 0); y <= std::min(y1, h - 1); ++y) {
      for (int x = std::max(x0, 0); x <= std::min(x1, w - 1); ++x) {
        const double px = x + 0.5, py = y + 0.5;
        double t = len2 > 0 ? ((px - ax) * dx + (py - ay) * dy) / len2 : 0;
        t = std::clamp(t, 0.0, 1.0);
        const double d = std::hypot(px - (ax + t * dx), py - (ay + t * dy));
        const double cover = std::clamp(r + 0.5 - d, 0.0, 1.0);
        // Where two segments meet, keep the larger coverage instead of darkening twice.
        uint8_t* p = &rgb[(size_t(y) * w + x) * 3];
        if (cover > 0 && !(p[0] == c.r && p[1] == c.g && p[2] == c.b)) blend(x, y, c, cover);
      }
    }
  }
  void glyphs(double x, double baseline, const std::string& s, int scale, Color c) {
    const int left = std::lround(x), top = std::lround(baseline) - font::kAscent * scale;
    for (size_t i = 0; i < s.size(); ++i) {
      const uint8_t* rows = font::glyph(s[i]);
      for (int gy = 0; gy < font::kHeight; ++gy)
        for (int gx = 0; gx < font::kWidth; ++gx)
          if (rows[gy] & (0x80 >> gx)) {
            const int px = left + (int(i) * font::kWidth + gx) * scale, py = top + gy * scale;
            fill(px, py, px + scale, py + scale, c);
          }
    }
  }
};

void put_u32(std::string& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8)
    out += static_cast<char>((v >> shift) & 0xff);
}

void put_chunk(std::string& out, const char* type, const std::string& data) {
  put_u32(out, static_cast<uint32_t>(data.size()));
  const std::string body = std::string(type, 4) + data;
  out += body;
  put_u32(out, static_cast<uint32_t>(
                   ::crc32(0, reinterpret_cast<const Bytef*>(body.data()), body.size())));
}

}  // namespace

double Picture::text_width(size_t chars, double size) {
  return double(chars) * font::kWidth * text_scale(size);
}

std::string Picture::svg() const {
  std::ostringstream os;
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width_ << "\" height=\"" << height_
     << "\" font-family=\"monospace\">\n"
     << "<rect width=\"100%\" height=\"100%\" fill=\"" << background_.hex() << "\"/>\n";
  for (const Shape& s : shapes_) {
    switch (s.kind) {
      case Shape::Box:
        os << "<rect x=\"" << s.points[0].first << "\" y=\"" << s.points[0].second << "\" width=\""
           << s.points[1].first << "\" height=\"" << s.points[1].second << "\" fill=\""
           << s.color.hex() << "\"";
        if (s.outline) os << " stroke=\"" << s.outline->hex() << "\"";
        os << "/>\n";
        break;
      case Shape::Line:
        os << "<polyline fill=\"none\" stroke=\"" << s.color.hex() << "\" stroke-width=\"" << s.size
           << "\" points=\"";
        for (size_t i = 0; i < s.points.size(); ++i)
          os << (i ? " " : "") << s.points[i].first << "," << s.points[i].second;
        os << "\"/>\n";
        break;
      case Shape::Text: {
        static const char* anchors[] = {"start", "middle", "end"};
        os << "<text x=\"" << s.points[0].first << "\" y=\"" << s.points[0].second
           << "\" font-size=\"" << s.size << "\" fill=\"" << s.color.hex() << "\"";
        if (s.anchor != Anchor::Start)
          os << " text-anchor=\"" << anchors[static_cast<int>(s.anchor)] << "\"";
        os << ">" << escaped(s.text) << "</text>\n";
        break;
      }
    }
  }
  os << "</svg>\n";
  return os.str();
}

std::string Picture::png() const {
  Canvas c(width_, height_, background_);
  for (const Shape& s : shapes_) {
    switch (s.kind) {
      case Shape::Box: {
        const int x0 = std::lround(s.points[0].first), y0 = std::lround(s.points[0].second);
        const int x1 = std::lround(s.points[0].first + s.points[1].first);
        const int y1 = std::lround(s.points[0].second + s.points[1].second);
        c.fill(x0, y0, x1, y1, s.color);
        if (s.outline) {
          c.fill(x0, y0, x1, y0 + 1, *s.outline);
          c.fill(x0, y1 - 1, x1, y1, *s.outline);
          c.fill(x0, y0, x0 + 1, y1, *s.outline);
          c.fill(x1 - 1, y0, x1, y1, *s.outline);
        }
        break;
      }
      case Shape::Line:
        for (size_t i = 1; i < s.points.size(); ++i)
          c.segment(s.points[i - 1].first, s.points[i - 1].second, s.points[i].first,
                    s.points[i].second, s.color, s.size);
        break;
      case Shape::Text: {
        const int scale = text_scale(s.size);
        double x = s.points[0].first;
        const double w = text_width(s.text.size(), s.size);
        if (s.anchor == Anchor::Middle) x -= w / 2;
        if (s.anchor == Anchor::End) x -= w;
        c.glyphs(x, s.points[0].second, s.text, scale, s.color);
        break;
      }
    }
  }
  // Rows of filter type 0 (none), then one zlib stream.
  std::string raw;
  raw.reserve(size_t(height_) * (width_ * 3 + 1));
  for (int y = 0; y < height_; ++y) {
    raw += '\0';
    raw.append(reinterpret_cast<const char*>(&c.rgb[size_t(y) * width_ * 3]), width_ * 3);
  }
  uLongf packed_size = compressBound(raw.size());
  std::string packed(packed_size, '\0');
  DTORCH_CHECK(compress2(reinterpret_cast<Bytef*>(packed.data()), &packed_size,
                         reinterpret_cast<const Bytef*>(raw.data()), raw.size(), 6) == Z_OK,
               "zlib could not compress a ", width_, " x ", height_, " picture");
  packed.resize(packed_size);

  std::string out = "\x89PNG\r\n\x1a\n";
  std::string header;
  put_u32(header, width_);
  put_u32(header, height_);
  header +=
      std::string("\x08\x02\x00\x00\x00", 5);  // 8 bits, RGB, deflate, no filter, no interlace
  put_chunk(out, "IHDR", header);
  put_chunk(out, "IDAT", packed);
  put_chunk(out, "IEND", "");
  return out;
}

void write_picture(const Picture& picture, const std::string& path) {
  auto ends_with = [&](const char* ext) {
    const std::string e = ext;
    return path.size() > e.size() && path.compare(path.size() - e.size(), e.size(), e) == 0;
  };
  const bool png = ends_with(".png") || ends_with(".PNG");
  DTORCH_CHECK_T(ConfigError, png || ends_with(".svg") || ends_with(".SVG"), path,
                 ": pictures are written as .png or .svg; name a file with one of those endings");
  const std::string bytes = png ? picture.png() : picture.svg();
  if (auto why = write_file_atomically(path, bytes.data(), bytes.size()))
    DTORCH_FAIL(ConfigError, *why);
}

}  // namespace dtorch
