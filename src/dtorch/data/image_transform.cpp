// Plain loops over 8-bit pixels, not tensor operations: an image is a few thousand pixels,
// and per-image tensor calls would cost more in dispatch than the arithmetic.
#include "dtorch/data/image_transform.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "dtorch/core/error.h"

namespace dtorch::data {
namespace {

// One output coordinate's input span and weights (PIL's "precompute coefficients").
struct Taps {
  std::vector<int64_t> first;  // first input index of each output index
  std::vector<int64_t> count;
  std::vector<float> weights;  // count[o] weights for output o, at o * stride
  int64_t stride = 0;
};

Taps bilinear_taps(int64_t in, int64_t out) {
  const double scale = static_cast<double>(in) / static_cast<double>(out);
  const double support = std::max(scale, 1.0);  // the triangle's half width, in input pixels
  Taps t;
  t.stride = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  t.first.resize(out);
  t.count.resize(out);
  t.weights.assign(static_cast<size_t>(out * t.stride), 0.f);
  for (int64_t o = 0; o < out; ++o) {
    const double center = (static_cast<double>(o) + 0.5) * scale;
    const int64_t lo = std::max<int64_t>(0, static_cast<int64_t>(center - support + 0.5));
    const int64_t hi = std::min<int64_t>(in, static_cast<int64_t>(center + support + 0.5));
    double total = 0;
    for (int64_t i = lo; i < hi; ++i) {
      const double w =
          std::max(0.0, 1.0 - std::abs((static_cast<double>(i) - center + 0.5) / support));
      t.weights[static_cast<size_t>(o * t.stride + (i - lo))] = static_cast<float>(w);
      total += w;
    }
    for (int64_t i = lo; i < hi; ++i)
      t.weights[static_cast<size_t>(o * t.stride + (i - lo))] /= static_cast<float>(total);
    t.first[o] = lo;
    t.count[o] = hi - lo;
  }
  return t;
}

uint8_t to_byte(float v) {
  return static_cast<uint8_t>(std::clamp(std::lround(v), 0L, 255L));
}

}  // namespace

RgbImage resize_shorter_side(const RgbImage& in, int64_t side) {
  DTORCH_CHECK(side >= 1 && in.width >= 1 && in.height >= 1, "cannot resize a ", in.width, "x",
               in.height, " image to side ", side);
  const int64_t shorter = std::min(in.width, in.height);
  if (shorter == side) return in;
  // Rounded as torchvision's Resize(int) does: the longer side scales with the shorter.
  const int64_t w = in.width <= in.height ? side : in.width * side / in.height;
  const int64_t h = in.height < in.width ? side : in.height * side / in.width;
  const Taps tx = bilinear_taps(in.width, w), ty = bilinear_taps(in.height, h);
  std::vector<float> rows(static_cast<size_t>(in.height * w * 3));  // horizontal pass
  for (int64_t y = 0; y < in.height; ++y) {
    const uint8_t* src = in.pixels.data() + y * in.width * 3;
    float* dst = rows.data() + y * w * 3;
    for (int64_t x = 0; x < w; ++x) {
      const float* wt = tx.weights.data() + x * tx.stride;
      float r = 0, g = 0, b = 0;
      for (int64_t k = 0; k < tx.count[x]; ++k) {
        const uint8_t* p = src + (tx.first[x] + k) * 3;
        r += wt[k] * p[0];
        g += wt[k] * p[1];
        b += wt[k] * p[2];
      }
      dst[x * 3] = r;
      dst[x * 3 + 1] = g;
      dst[x * 3 + 2] = b;
    }
  }
  RgbImage out;
  out.width = w;
  out.height = h;
  out.pixels.resize(static_cast<size_t>(w * h * 3));
  for (int64_t y = 0; y < h; ++y) {  // vertical pass
    const float* wt = ty.weights.data() + y * ty.stride;
    uint8_t* dst = out.pixels.data() + y * w * 3;
    for (int64_t x = 0; x < w * 3; ++x) {
      float v = 0;
      for (int64_t k = 0; k < ty.count[y]; ++k)
        v += wt[k] * rows[static_cast<size_t>((ty.first[y] + k) * w * 3 + x)];
      dst[x] = to_byte(v);
    }
  }
  return out;
}

uint64_t sample_seed(uint64_t seed, int64_t epoch, int64_t index) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epoch) * 0xBF58476D1CE4E5B9ull +
               static_cast<uint64_t>(index) * 0x94D049BB133111EBull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void transform_image(const RgbImage& in, const ImageTransform& t, uint64_t seed, float* out) {
  const RgbImage sized = resize_shorter_side(in, t.size);
  const int64_t S = t.size;
  // The centre S x S of the resized image (torchvision's CenterCrop rounds the offset).
  int64_t x0 = static_cast<int64_t>(std::lround(static_cast<double>(sized.width - S) / 2.0));
  int64_t y0 = static_cast<int64_t>(std::lround(static_cast<double>(sized.height - S) / 2.0));
  bool flip = false;
  if (t.augment) {
    // RandomCrop with padding: an S x S window of the image framed by `pad` black pixels.
    const uint64_t span = static_cast<uint64_t>(2 * t.pad + 1);
    x0 += static_cast<int64_t>(seed % span) - t.pad;
    y0 += static_cast<int64_t>((seed / span) % span) - t.pad;
    flip = ((seed >> 40) & 1) != 0;
  }
  float scale[3], shift[3];
  for (int c = 0; c < 3; ++c) {
    scale[c] = 1.f / (255.f * t.std[c]);
    shift[c] = -t.mean[c] / t.std[c];
  }
  for (int64_t y = 0; y < S; ++y) {
    const int64_t sy = y0 + y;
    for (int64_t x = 0; x < S; ++x) {
      const int64_t sx = x0 + (flip ? S - 1 - x : x);
      const bool inside = sy >= 0 && sy < sized.height && sx >= 0 && sx < sized.width;
      const uint8_t* p = inside ? sized.pixels.data() + (sy * sized.width + sx) * 3 : nullptr;
      for (int c = 0; c < 3; ++c)
        out[(c * S + y) * S + x] = (p ? static_cast<float>(p[c]) : 0.f) * scale[c] + shift[c];
    }
  }
}

}  // namespace dtorch::data
