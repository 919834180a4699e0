// Pictures for people: boxes, lines and text on a canvas, written as SVG or as PNG, so that the
// command line draws pipeline timelines and training curves without a plotting library.
//   Picture p(400, 200);
//   p.box(10, 10, 50, 20, Color::hex("#6baed6"), Color::hex("#333333"));
//   p.text(12, 24, "F0");
//   write_picture(p, "out.png");   // or out.svg
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dtorch {

struct Color {
  uint8_t r = 0, g = 0, b = 0;
  /// "#rrggbb"; ConfigError otherwise.
  static Color hex(const std::string& rgb);
  std::string hex() const;
  bool operator==(const Color& o) const { return r == o.r && g == o.g && b == o.b; }
};

/// Note [Two renderings of one picture]: shapes are kept as a list and rendered twice, as SVG
/// text (any browser draws it, text in the viewer's monospace font) and as PNG pixels (boxes on
/// whole pixels, lines anti-aliased by their distance to each pixel centre, text in
/// core/bitmap_font.h's 7 x 13 glyphs, twice that at size >= 18). Coordinates are pixels from
/// the top left; a text's y is its baseline, as in SVG.
class Picture {
 public:
  enum class Anchor { Start, Middle, End };

  Picture(int width, int height, Color background = {255, 255, 255});

  /// A filled box, with a one-pixel outline when `outline` is set.
  void box(double x, double y, double w, double h, Color fill,
           std::optional<Color> outline = std::nullopt);
  /// A polyline through `points` (x, y), `width` pixels wide.
  void line(std::vector<std::pair<double, double>> points, Color color, double width = 1);
  /// One line of text with its baseline at y; `size` in pixels.
  void text(double x, double y, std::string s, double size = 11, Color color = {0, 0, 0},
            Anchor anchor = Anchor::Start);

  /// The width a text of `chars` characters takes in the PNG rendering (the SVG one is close).
  static double text_width(size_t chars, double size = 11);

  std::string svg() const;
  /// An 8-bit RGB PNG file's bytes.
  std::string png() const;

  int width() const { return width_; }
  int height() const { return height_; }

 private:
  struct Shape {
    enum Kind { Box, Line, Text } kind = Box;
    std::vector<std::pair<double, double>> points{};  // Box: corner and size; Line: the path
    Color color{};
    // The rest only where the kind uses it.
    std::optional<Color> outline{};
    double size = 0;  // Line: width; Text: font size
    std::string text{};
    Anchor anchor = Anchor::Start;
  };
  int width_, height_;
  Color background_;
  std::vector<Shape> shapes_;
};

/// Writes `picture` to `path` as SVG or PNG, by its extension (.svg, .png), through a temporary
/// file renamed into place. ConfigError naming the path for another extension or an unwritable
/// directory.
void write_picture(const Picture& picture, const std::string& path);

}  // namespace dtorch
