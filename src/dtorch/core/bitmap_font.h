// A small bitmap font for text in PNG pictures (SVG text is drawn by whatever shows the file).
#pragma once

#include <cstdint>

namespace dtorch::font {

/// Every glyph is kWidth x kHeight pixels; rows 0 .. kAscent - 1 stand above the baseline.
constexpr int kWidth = 7, kHeight = 13, kAscent = 11;

/// The rows of `c` (kHeight bytes, most significant bit leftmost); '?' for characters outside
/// printable ASCII.
const uint8_t* glyph(char c);

}  // namespace dtorch::font
